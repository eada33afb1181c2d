"""The Ditto baseline (Li et al., ICML 2021) and the proximal term both client trainers gained for it.

- ``proximal_penalty`` / ``LoRATrainer.train(prox, anchor)``: the term's value against numpy and a finite
  difference, and one AdamW step of the real trainer against a float64 autograd oracle
  (``test_prox_step_matches_a_float64_oracle``: a flipped sign, a lost or doubled 1/2 fail it).
- ``BatchedLoRATrainer.train_many``: each client pulled toward its own anchor
  (``test_batched_prox_uses_each_clients_anchor``).
- ``Ditto`` on the protocol: the personal adapters follow Algorithm 1 (anchored at the round's global adapters,
  kept private, evaluated) against a plain loop (``test_ditto_follows_algorithm_1``); lam = 0 is local training,
  lam -> inf is the global model; both runners agree on a real tiny model.
"""

from __future__ import annotations

import copy
import dataclasses

import numpy as np
import pytest

from icml26.common.federation import run_in_process
from icml26.fedtreelora.baselines import ARMS, Ditto, FedAvgLoRA, LocalLoRA
from icml26.fedtreelora.core import PERSONAL, run_batched

from .test_core import FakeClient


# ------------------------------------------------------------------------------- a numpy stand-in trainer
class ProxTrainer:
    """numpy stand-in for both trainers: a step moves every factor 10 % toward the client's target, then takes
    the proximal step of ``prox/2 ||v - anchor||^2`` (closed form, so lam -> inf lands on the anchor):

    $$u = v + 0.1(t - v),\\qquad v \\leftarrow (u + 0.1\\lambda a) / (1 + 0.1\\lambda)$$

    It records the seeds it trains with and the adapters each evaluation sees."""

    def __init__(self, layers=2, r=2, d=3):
        self.keys = [f"base_model.model.model.layers.{layer}.self_attn.{m}.lora_{f}.weight"
                     for layer in range(layers) for m in ("q_proj", "v_proj") for f in "AB"]
        self.layers = list(range(layers))
        self.shape = {k: (r, d) if k.endswith("lora_A.weight") else (d, r) for k in self.keys}
        self.calls, self.evaluated = [], []

    def init_state(self):
        return {k: (np.full(self.shape[k], 0.5, np.float32) if "lora_A" in k else np.zeros(self.shape[k], np.float32))
                for k in self.keys}

    def train(self, data, clus, ext, mix, *, steps, lr, seed, train_A, train_B, gate_lr, prox=0.0, anchor=None):
        self.calls.append((tuple(seed), prox))
        out = {}
        for k, v in clus.items():
            v = np.asarray(v, np.float64)
            for _ in range(steps):
                v = v + 0.1 * (data[0][k] - v)
                if prox > 0:
                    v = (v + 0.1 * prox * np.asarray(anchor[k], np.float64)) / (1 + 0.1 * prox)
            out[k] = v.astype(np.float32)
        return out, dict(mix)

    def correct(self, data, clus, ext, mix):
        self.evaluated.append({k: np.asarray(v, np.float64) for k, v in clus.items()})
        return np.full(len(data[1]), float(np.mean([v.mean() for k, v in clus.items() if "lora_B" in k]) > 0))

    def train_many(self, datas, inputs, kwargs):
        return [self.train(d, *inp, **kw) for d, inp, kw in zip(datas, inputs, kwargs, strict=True)]

    def correct_many(self, datas, inputs):
        return [self.correct(d, *inp) for d, inp in zip(datas, inputs, strict=True)]


def _clients(tr, seed=0, n=3):
    rng = np.random.default_rng(seed)
    return [FakeClient(c, {k: rng.normal(size=tr.shape[k]) for k in tr.keys}, n=4 + 2 * c) for c in range(n)]


def _ditto_by_hand(tr, clients, lam, rounds, steps):
    """Algorithm 1 as a plain loop: FedAvg of w (example-weighted), v_k anchored at the round's w^t."""
    def local(v, target, anchor=None):
        for _ in range(steps):
            v = v + 0.1 * (target - v)
            if anchor is not None:
                v = (v + 0.1 * lam * anchor) / (1 + 0.1 * lam)
        return v

    init = {k: v.astype(np.float64) for k, v in tr.init_state().items()}
    w, v = dict(init), [dict(init) for _ in clients]
    weights = np.array([c.n_train for c in clients], dtype=float)
    for _ in range(rounds):
        v = [{k: local(v[c][k], cl.train[0][k], w[k]) for k in tr.keys} for c, cl in enumerate(clients)]
        ups = [{k: local(w[k], cl.train[0][k]) for k in tr.keys} for cl in clients]
        w = {k: sum(wt * u[k] for wt, u in zip(weights, ups, strict=True)) / weights.sum() for k in tr.keys}
    return v, w


# ------------------------------------------------------------------------------------------ the protocol
@pytest.mark.parametrize("runner", ["in_process", "batched"])
def test_ditto_follows_algorithm_1(runner):
    tr = ProxTrainer()
    clients = _clients(tr)
    algo = Ditto(tr, lam=0.7, train_rounds=3, local_steps=2, lr=0.1, seed=5)
    out = run_batched(algo, clients, tr) if runner == "batched" else run_in_process(algo, clients)
    v, w = _ditto_by_hand(tr, clients, lam=0.7, rounds=3, steps=2)
    seen = tr.evaluated[:len(clients)] if runner == "batched" else tr.evaluated[0::2]   # val then test per client
    assert len(seen) == len(clients)
    for c, got in enumerate(seen):                   # the evaluation scores v_k, not the global w
        for k in tr.keys:
            np.testing.assert_allclose(got[k], v[c][k], rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(out["messages"][c]["clus/" + k], w[k], rtol=1e-5, atol=1e-6)
        assert max(np.abs(got[k] - w[k]).max() for k in tr.keys) > 1e-2
    # both passes every round: the global one with (seed, cid, rnd), the personal one with (seed, cid, rnd, 1)
    seeds = sorted(s for s, _ in tr.calls)
    assert seeds == sorted([(5, c, r) for c in range(3) for r in (1, 2, 3)]
                           + [(5, c, r, 1) for c in range(3) for r in (1, 2, 3)])
    assert {p for s, p in tr.calls if len(s) == 4} == {0.7}
    # only the global adapters travel: the bytes are FedAvg's
    fedavg = run_in_process(FedAvgLoRA(tr, train_rounds=3, local_steps=2, lr=0.1, seed=5), clients)
    assert out["bytes_up"] == fedavg["bytes_up"] and out["bytes_down"] == fedavg["bytes_down"]


def test_ditto_keeps_the_personal_adapters_private():
    tr = ProxTrainer()
    clients = _clients(tr)
    _, log = run_in_process(Ditto(tr, lam=0.7, train_rounds=2, local_steps=1, lr=0.1), clients, transcript=True)
    for replies in log.replies[:2]:
        assert all(set(r) == {"lora/" + k for k in tr.keys} | {"num_examples"} for r in replies.values())
    algo = Ditto(tr, lam=0.7, train_rounds=2, local_steps=1, lr=0.1)
    _, state = algo.client_step(clients[0], {"phase": "train"}, {}, 1)
    assert {k for k in state if k.startswith(PERSONAL)} == {PERSONAL + k for k in tr.keys}


def test_ditto_lam_zero_is_local_training_and_lam_large_is_the_global_model():
    tr = ProxTrainer()
    clients = _clients(tr)
    kw = dict(train_rounds=3, local_steps=2, lr=0.1, seed=1)
    run_in_process(Ditto(tr, lam=0.0, **kw), clients)
    ditto0 = tr.evaluated[0::2]
    tr.evaluated = []
    run_in_process(LocalLoRA(tr, **kw), clients)
    for a, b in zip(ditto0, tr.evaluated[0::2], strict=True):
        for k in tr.keys:
            np.testing.assert_array_equal(a[k], b[k])
    # lam = 0: a client's personal model does not depend on the other clients' data
    tr.evaluated = []
    other = [clients[0], FakeClient(1, {k: -5 * v for k, v in clients[1].train[0].items()}), clients[2]]
    run_in_process(Ditto(tr, lam=0.0, **kw), other)
    for k in tr.keys:
        np.testing.assert_array_equal(tr.evaluated[0][k], ditto0[0][k])
    # lam -> inf: v_k is the global model the client received in the last training round
    tr.evaluated = []
    _, log = run_in_process(Ditto(tr, lam=1e12, **kw), clients, transcript=True)
    for c, seen in enumerate(tr.evaluated[0::2]):
        for k in tr.keys:
            np.testing.assert_allclose(seen[k], log.messages[2][c]["clus/" + k], rtol=1e-6, atol=1e-9)


def test_ditto_bad_inputs_are_named():
    tr = ProxTrainer()
    kw = dict(train_rounds=2, local_steps=1, lr=0.1)
    for lam in (-1.0, float("nan"), float("inf"), True, "1"):
        with pytest.raises(ValueError, match="lam"):
            Ditto(tr, lam=lam, **kw)
    with pytest.raises(TypeError, match="lam"):
        Ditto(tr, **kw)
    assert ARMS["ditto"] is Ditto and Ditto.name == "ditto"


# ------------------------------------------------------------------------------- the real trainers (torch)
@pytest.fixture(scope="module")
def lab():
    pytest.importorskip("transformers")
    from icml26.common.tiny_lm import char_tokenizer, tiny_causal_lm
    from icml26.fedtreelora.data import World, make_clients

    tok = char_tokenizer()
    base = tiny_causal_lm(len(tok), hidden=16, layers=2, heads=2, kv_heads=1, intermediate=32, max_positions=16,
                          seed=0)
    clients = make_clients(World(per_rule=1), tok, n_train=16, n_val=8, n_test=12, seed=0)
    return base, tok, clients


def _trainers(lab, n):
    from icml26.fedtreelora.client import BatchedLoRATrainer, LoRATrainer

    base, tok, _ = lab
    kw = dict(r=2, alpha=4, batch_size=8)
    return LoRATrainer(copy.deepcopy(base), tok, **kw), BatchedLoRATrainer(base, tok, n, **kw)


def _random_state(trainer, rng, scale=0.3):
    return {k: (v + scale * rng.normal(size=v.shape)).astype(np.float32) for k, v in trainer.init_state().items()}


def test_proximal_penalty_value_and_gradient():
    import torch

    from icml26.fedtreelora.client import proximal_penalty

    rng = np.random.default_rng(0)
    theta = [rng.normal(size=(2, 3)), rng.normal(size=(4, 2))]
    anchor = [rng.normal(size=(2, 3)), rng.normal(size=(4, 2))]
    lam = 0.37
    params = [torch.tensor(t, requires_grad=True) for t in theta]
    value = proximal_penalty(params, [torch.tensor(a) for a in anchor], lam)
    expected = lam / 2 * sum(((t - a) ** 2).sum() for t, a in zip(theta, anchor, strict=True))
    assert float(value.detach()) == pytest.approx(expected, rel=1e-12)
    value.backward()
    for p, t, a in zip(params, theta, anchor, strict=True):      # autograd = lam (theta - a) = finite difference
        np.testing.assert_allclose(p.grad.numpy(), lam * (t - a), rtol=1e-12)
    h, t0 = 1e-6, [x.copy() for x in theta]
    t0[0][1, 2] += h
    fd = (lam / 2 * sum(((t - a) ** 2).sum() for t, a in zip(t0, anchor, strict=True)) - expected) / h
    assert fd == pytest.approx(lam * (theta[0][1, 2] - anchor[0][1, 2]), rel=1e-4)


def _ce_grad64(trainer, data, state, seed):
    """float64 autograd of the mean cross-entropy on the batch ``train`` draws first (an independent oracle)."""
    import torch

    from icml26.fedtreelora.module import lora_modules, peft_key, set_lora_state

    model = copy.deepcopy(trainer.model).double().train()
    set_lora_state(model, state)
    mods = lora_modules(model)
    for m in mods.values():
        m.lora_A.requires_grad_(True)
        m.lora_B.requires_grad_(True)
    x, y = torch.from_numpy(data[0]), torch.from_numpy(data[1])
    idx = torch.from_numpy(np.random.default_rng(list(seed)).integers(0, len(y), size=min(trainer.batch_size, len(y))))
    scores = model(input_ids=x[idx], logits_to_keep=1).logits[:, -1, :][:, trainer.label_ids]
    torch.nn.functional.cross_entropy(scores, y[idx]).backward()
    return {peft_key(n, f): (m.lora_A if f == "A" else m.lora_B).grad.numpy().copy()
            for n, m in mods.items() for f in "AB"}


def test_prox_step_matches_a_float64_oracle(lab):
    # One AdamW step moves each entry by lr * g / (|g| + eps), g = grad CE + lam (theta - a). With the anchor
    # a = theta + c grad CE / lam the true g is (1 - c) grad CE: c = 0.75 keeps CE's sign (a doubled term flips it),
    # c = 1.5 flips it (a halved or sign-flipped term keeps it).
    single, _ = _trainers(lab, 1)
    data = lab[2][0].train
    theta = _random_state(single, np.random.default_rng(1))
    seed, lam, lr = (3, 0, 1), 10.0, 1e-2
    g_ce = _ce_grad64(single, data, theta, seed)
    for c in (0.75, 1.5):
        anchor = {k: (theta[k] + c * g_ce[k] / lam).astype(np.float32) for k in theta}
        out, _ = single.train(data, theta, None, None, steps=1, lr=lr, seed=seed, prox=lam, anchor=anchor)
        moved = 0
        for k in theta:
            g = g_ce[k] + lam * (theta[k].astype(np.float64) - anchor[k])
            ok = np.abs(g) > 1e-5
            moved += int(ok.sum())
            np.testing.assert_allclose(out[k][ok], (theta[k] - lr * g / (np.abs(g) + 1e-8))[ok], atol=lr * 1e-2,
                                       err_msg=f"c={c} {k}")
        assert moved > 100
    # a huge lam: every entry steps by lr toward its anchor; lam = 0: the anchor is ignored
    sign = np.random.default_rng(2)
    anchor = {k: (v + 3 * lr * sign.choice([-1.0, 1.0], size=v.shape)).astype(np.float32) for k, v in theta.items()}
    out, _ = single.train(data, theta, None, None, steps=1, lr=lr, seed=seed, prox=1e6, anchor=anchor)
    for k in theta:
        np.testing.assert_allclose(out[k], theta[k] + lr * np.sign(anchor[k] - theta[k]), atol=1e-5)
    plain, _ = single.train(data, theta, None, None, steps=1, lr=lr, seed=seed)
    zero, _ = single.train(data, theta, None, None, steps=1, lr=lr, seed=seed, prox=0.0, anchor=anchor)
    for k in theta:
        np.testing.assert_array_equal(zero[k], plain[k])
        np.testing.assert_allclose(plain[k], theta[k] - lr * np.sign(g_ce[k]), atol=lr * 0.05)


def test_batched_prox_uses_each_clients_anchor(lab):
    clients = lab[2]
    n = len(clients)
    single, batched = _trainers(lab, n)
    rng = np.random.default_rng(4)
    starts = [_random_state(single, rng) for _ in range(n)]
    anchors = [_random_state(single, rng, scale=1.0) for _ in range(n)]       # a different anchor per client
    kwargs = [dict(steps=3, lr=0.05, seed=(0, c, 1, 1), train_A=True, train_B=True, gate_lr=None, prox=2.0,
                   anchor=anchors[c]) for c in range(n)]
    got = batched.train_many([c.train for c in clients], [(s, {}, {}) for s in starts], kwargs)
    for c in range(n):
        want, _ = single.train(clients[c].train, starts[c], {}, {}, **kwargs[c])
        for k in want:
            np.testing.assert_allclose(got[c][0][k], want[k], atol=1e-5, err_msg=f"client {c} {k}")
    # B only: A must not move, and its anchor is not used
    ffa = [dict(kw, train_A=False) for kw in kwargs]
    got = batched.train_many([c.train for c in clients], [(s, {}, {}) for s in starts], ffa)
    for c in range(n):
        want, _ = single.train(clients[c].train, starts[c], {}, {}, **ffa[c])
        for k in want:
            np.testing.assert_allclose(got[c][0][k], want[k], atol=1e-5)
            if "lora_A" in k:
                np.testing.assert_array_equal(got[c][0][k], starts[c][k])


def test_prox_bad_inputs_are_named(lab):
    clients = lab[2]
    single, batched = _trainers(lab, len(clients))
    data, init = clients[0].train, single.init_state()
    kw = dict(steps=1, lr=0.1, seed=(0,))
    for prox in (-1.0, float("nan"), float("inf"), True):
        with pytest.raises(ValueError, match="prox"):
            single.train(data, init, None, None, prox=prox, anchor=init, **kw)
    with pytest.raises(ValueError, match="anchor=None"):
        single.train(data, init, None, None, prox=1.0, **kw)
    key = next(iter(init))
    with pytest.raises(ValueError, match=r"anchor: keys .*\(missing \[.base_model"):
        single.train(data, init, None, None, prox=1.0, anchor={k: v for k, v in init.items() if k != key}, **kw)
    with pytest.raises(ValueError, match=r"anchor: .* has shape"):
        single.train(data, init, None, None, prox=1.0, anchor={**init, key: np.zeros((1, 1))}, **kw)
    with pytest.raises(ValueError, match=r"anchor: .* NaN"):
        single.train(data, init, None, None, prox=1.0, anchor={**init, key: np.full_like(init[key], np.nan)}, **kw)
    datas, inputs = [c.train for c in clients], [(init, {}, {})] * len(clients)
    base = dict(steps=1, lr=0.1, train_A=True, train_B=True, gate_lr=None)
    unequal = [dict(base, seed=(0, c), prox=float(c), anchor=init) for c in range(len(clients))]
    with pytest.raises(ValueError, match="prox"):
        batched.train_many(datas, inputs, unequal)
    lacking = [dict(base, seed=(0, c), prox=1.0, anchor=init if c else None) for c in range(len(clients))]
    with pytest.raises(ValueError, match="client 0's anchor=None"):
        batched.train_many(datas, inputs, lacking)


def test_ditto_runners_agree_on_a_tiny_model(lab):
    clients = lab[2]
    single, batched = _trainers(lab, len(clients))

    class Seen(Ditto):
        def eval_inputs(self, message, state):
            out = super().eval_inputs(message, state)
            self.seen.append(out[0])
            return out

    runs = []
    for run in (lambda a: run_in_process(a, clients), lambda a: run_batched(a, clients, batched)):
        algo = Seen(single, lam=0.5, train_rounds=3, local_steps=3, lr=0.05, seed=4)
        algo.seen = []
        runs.append((run(algo), algo.seen))
    (a, seen_a), (b, seen_b) = runs
    assert a["bytes_up"] == b["bytes_up"] and a["bytes_down"] == b["bytes_down"]
    for c in range(len(clients)):
        np.testing.assert_array_equal(a["test"][c], b["test"][c])
        for k, v in a["messages"][c].items():
            np.testing.assert_allclose(b["messages"][c][k], v, atol=1e-5)
        for k, v in seen_a[c].items():
            np.testing.assert_allclose(seen_b[c][k], v, atol=1e-5)     # the personal adapters evaluated
            assert np.abs(v - a["messages"][c]["clus/" + k]).max() > 1e-3  # ... are not the global ones
    # lam = 0: a client's personal model ignores the other clients' data
    changed = [clients[0], dataclasses.replace(clients[1], train=clients[2].train), *clients[2:]]
    algo0 = Seen(single, lam=0.0, train_rounds=2, local_steps=2, lr=0.05, seed=4)
    algo0.seen = []
    run_batched(algo0, clients, batched)
    run_batched(algo0, changed, batched)
    n = len(clients)
    for k, v in algo0.seen[0].items():
        np.testing.assert_array_equal(algo0.seen[n][k], v)
    assert any(np.abs(algo0.seen[1][k] - algo0.seen[n + 1][k]).max() > 0 for k in algo0.seen[1])
