"""Issue #50 item 3: the twisted world and its exact ceilings, FedAvg + FT, the headline's comparator, the
bracketed tuning, and unseen clients placed into the tree."""

from __future__ import annotations

import numpy as np
import pytest

from icml26.common.federation import run_in_process
from icml26.fedtreelora.baselines import FedAvgFT
from icml26.fedtreelora.core import FedTreeLoRA, place_client
from icml26.fedtreelora.data import COUNTS, World, make_clients
from icml26.fedtreelora.experiment import BASELINES, PRESETS, best_baseline, edge_note, tree_start, tune_arm

from .test_core import BatchedLinearTrainer, FakeClient, LinearTrainer, _clients


# ------------------------------------------------------------------------------------------------- the world
def _parse(s):
    body, q = s.split(":")
    return body.count(q), q


def test_labels_flip_on_the_twist_letters_and_ceilings_are_exact():
    world = World()
    rng = np.random.default_rng(1)
    hits = {"global": [], "zero_shot": []}
    for client in world.clients:
        strings, labels = world.sample(client, rng, 3000)
        counts, twisted = zip(*[(c, q in world.twist) for c, q in map(_parse, strings)], strict=True)
        counts, twisted = np.array(counts), np.array(twisted)
        # $$y = [count \in P_k] \oplus [q \in twist]$$, checked against the string itself
        assert np.array_equal(labels, np.isin(counts, list(client.positive)).astype(int) ^ twisted)
        assert 0.45 < twisted.mean() < 0.55                                # four of eight letters
        hits["global"].append(np.mean(((counts >= 1).astype(int) ^ twisted) == labels))
        hits["zero_shot"].append(np.mean((counts >= 1).astype(int) == labels))
    ceil = world.ceilings()
    # hand-computed: the best global rule "count >= 1" (flipped on the twist) is right on 17 of 24 (count, label)
    # cells weighted by the sampling law; the base's unflipped answer keeps that on half and inverts it on half
    assert world.twist == "abcd" and World(letters="abc").twist == "a"
    assert ceil == pytest.approx({"oracle": 1.0, "global": 17 / 24, "zero_shot": 0.5 * 17 / 24 + 0.5 * 7 / 24})
    assert World(twist="ab").ceilings()["zero_shot"] == pytest.approx(0.75 * 17 / 24 + 0.25 * 7 / 24)
    for name in ("global", "zero_shot"):                                # Monte Carlo, an independent oracle
        assert np.mean(hits[name]) == pytest.approx(ceil[name], abs=0.015)
    flat = World(twist="").ceilings()
    assert flat["global"] == pytest.approx(flat["zero_shot"])           # v1: a global model capped at zero-shot


def test_unseen_clients_one_per_rule_and_bad_worlds():
    world = World()
    assert [c.cid for c in world.unseen] == [8, 9, 10, 11]
    assert [c.rule for c in world.unseen] == [c.rule for c in world.clients[::2]]
    assert World(unseen_per_rule=0).unseen == [] and World(per_rule=1).n_clients == 4

    class Tok:
        def __call__(self, s, add_special_tokens=False):
            return {"input_ids": [ord(ch) for ch in s]}

    new = make_clients(world, Tok(), n_train=8, n_val=4, n_test=4, seed=0, specs=world.unseen)
    old = make_clients(world, Tok(), n_train=8, n_val=4, n_test=4, seed=0)
    assert [c.cid for c in new] == [8, 9, 10, 11] and not set(new[0].item_ids("test")) & set(old[0].item_ids("test"))
    for bad in ("ax", "aa", "abcdefgh"):
        with pytest.raises(ValueError, match="twist"):
            World(twist=bad)
    with pytest.raises(ValueError, match="unseen_per_rule"):
        World(unseen_per_rule=-1)
    assert set(COUNTS) == {0, 1, 2, 3}


# ---------------------------------------------------------------------------------------------- FedAvg + FT
def test_fedavg_ft_averages_then_fine_tunes_locally():
    rng = np.random.default_rng(3)
    tr = BatchedLinearTrainer()
    clients = _clients(tr, rng)
    algo = FedAvgFT(tr, train_rounds=3, local_steps=1, lr=0.1, seed=0, ft_rounds=1)
    out, log = run_in_process(algo, clients, transcript=True)
    for rnd in (1, 2):                                                  # rounds 2 and 3 start from FedAvg
        assert {k[len("clus/"):] for k in log.messages[rnd][0] if k.startswith("clus/")} == set(tr.keys)
    assert not any(k.startswith("clus/") for k in log.messages[3][0])  # evaluation: each client's own adapters
    assert set(log.replies[2][0]) == {"num_examples"}                   # the fine-tuning round sends nothing
    assert out["bytes_up"][2] == 0
    # the evaluated adapters: the round-2 global, moved one 10 % step toward the client's own target
    glob = {k: log.messages[2][0]["clus/" + k].astype(np.float64) for k in tr.keys}
    for client, seen in zip(clients, tr.evaluated[0::2], strict=True):
        for k in tr.keys:
            np.testing.assert_allclose(seen[k], glob[k] + 0.1 * (client.train[0][k] - glob[k]), rtol=1e-5, atol=1e-6)
    for bad in (0, 3, True):
        with pytest.raises(ValueError, match="ft_rounds"):
            FedAvgFT(tr, train_rounds=3, local_steps=1, lr=0.1, ft_rounds=bad)


# ------------------------------------------------------------------------------------ comparator and tuning
def test_best_baseline_is_chosen_on_validation_never_on_test():
    metrics = {"local": {"val_accuracy": 0.80, "accuracy": 0.95},
               "ditto": {"val_accuracy": 0.90, "accuracy": 0.70},
               "fedsa_lora": {"val_accuracy": 0.90, "accuracy": 0.99},
               "fedtreelora": {"val_accuracy": 0.99, "accuracy": 0.99},
               "oracle_cluster": {"val_accuracy": 1.0, "accuracy": 1.0}}
    assert best_baseline(metrics) == "ditto"          # ties go to the earlier of BASELINES, test never read
    assert BASELINES.index("ditto") < BASELINES.index("fedsa_lora")
    assert best_baseline({"fedtreelora": {"val_accuracy": 1.0}}) is None


def test_ditto_tunes_lambda_with_a_learning_rate_search_per_lambda():
    import dataclasses

    cfg = dataclasses.replace(PRESETS["quick"], lr_grid=(1e-3, 1e-2, 1e-1), ditto_lams=(0.1, 1.0, 10.0), lr_extend=1)
    calls = []

    def run_one(lr, lam):
        calls.append((lr, lam))
        return {"val": -abs(np.log10(lr) + 2) - abs(np.log10(lam) - 1), "lr": lr, "lam": lam}

    rec, out = tune_arm("ditto", cfg, run_one)
    assert (out["lr"], out["lam"]) == (1e-2, 10.0) and rec["lr"]["chosen"] == 1e-2
    assert rec["lam"]["grid"] == pytest.approx([0.1, 1.0, 10.0, 100.0]) and rec["lam"]["chosen"] == 10.0
    assert not rec["lam"]["at_edge"] and {lam for _, lam in calls} == {0.1, 1.0, 10.0, 100.0}
    assert len(calls) == 4 * 3                                           # every lambda its own lr search
    note = edge_note(cfg, {"local": {"lr": {"chosen": 1e-3, "grid": [1e-3, 1e-2], "at_edge": True}}, **{"ditto": rec}})
    assert note == "on the edge of its grid after 1 extension(s): local lr 0.001 of [0.001, 0.01]"
    assert edge_note(cfg, {"ditto": rec}) is None


# ----------------------------------------------------------------------------------------- unseen clients
def _two_groups_B(rng, n=4, noise=0.01):
    shared, two = rng.normal(size=(3, 2)), rng.normal(size=(2, 3, 2))
    return {k: [[shared + noise * rng.normal(size=(3, 2))], [two[k // 2] + noise * rng.normal(size=(3, 2))]]
            for k in range(n)}, shared, two


def test_place_client_joins_the_nearest_finest_block_and_its_parents():
    rng = np.random.default_rng(0)
    B, shared, two = _two_groups_B(rng)
    parts = [[frozenset(range(4))], [frozenset({0, 1}), frozenset({2, 3})]]
    for g in (0, 1):
        new = [[shared], [two[g] + 0.05 * rng.normal(size=(3, 2))]]
        assert place_client(new, B, parts) == [frozenset(range(4)), frozenset({2 * g, 2 * g + 1})]
    with pytest.raises(ValueError, match="refine"):
        place_client([[shared], [two[0]]], B, [[frozenset({0, 2}), frozenset({1, 3})], parts[1]])
    with pytest.raises(ValueError, match="cover"):
        place_client([[shared], [two[0]]], B, [[frozenset({0, 1, 2})], parts[1]])


def test_an_unseen_client_starts_from_its_blocks_experts():
    rng = np.random.default_rng(2)
    tr = LinearTrainer()
    base = rng.normal(size=(3, 2))
    clients = []
    for c in range(4):  # as in test_core: one trunk in layer 0, two branches in layer 1
        target = {k: (base if ".layers.0." in k else (1 if c < 2 else -1) * base + 0.01 * rng.normal(size=(3, 2)))
                  if "lora_B" in k else np.full((2, 3), 0.5) for k in tr.keys}
        clients.append(FakeClient(c, {k: np.asarray(v, np.float32) for k, v in target.items()}))
    algo = FedTreeLoRA(tr, train_rounds=3, local_steps=1, lr=0.1, seed=1, warmup_rounds=1)
    state = run_in_process(algo, clients)
    assert state["log"]["cuts"] == [1, 2]
    warm = {k: (-base if "lora_B" in k and ".layers.1." in k else v) for k, v in clients[0].train[0].items()}
    message, blocks = tree_start(algo, state, warm)
    assert blocks == [frozenset(range(4)), frozenset({2, 3})]
    for k in tr.keys:
        src = 2 if ".layers.1." in k else 0
        np.testing.assert_array_equal(message["clus/" + k], state["messages"][src]["clus/" + k])
        assert ("ext/" + k in message) == (".layers.1." in k)             # the trunk has no external expert
        if ".layers.1." in k:
            np.testing.assert_array_equal(message["ext/" + k], state["messages"][3]["ext/" + k])
    clus, _, _ = algo.client_inputs(message, {})
    assert not np.array_equal(clus[tr.keys[-1]], tr.init_state()[tr.keys[-1]])


def test_unseen_outcomes_fine_tune_from_the_placed_experts_with_equal_compute():
    import dataclasses
    from types import SimpleNamespace

    from icml26.fedtreelora.experiment import unseen_outcomes

    rng = np.random.default_rng(2)
    tr = BatchedLinearTrainer()
    base = rng.normal(size=(3, 2))

    def target(sign):
        return {k: np.asarray((base if ".layers.0." in k else sign * base + 0.01 * rng.normal(size=(3, 2)))
                              if "lora_B" in k else np.full((2, 3), 0.5), np.float32) for k in tr.keys}

    clients = [FakeClient(c, target(1 if c < 2 else -1)) for c in range(4)]
    algo = FedTreeLoRA(tr, train_rounds=3, local_steps=1, lr=0.1, seed=1, warmup_rounds=1)
    state = run_in_process(algo, clients)
    world = SimpleNamespace(clients=[SimpleNamespace(subgroup=c // 2) for c in range(4)])
    new = FakeClient(9, target(-1))
    new.spec = SimpleNamespace(subgroup=1)
    cfg = dataclasses.replace(PRESETS["smoke"], warmup_rounds=1, ft_rounds=2)
    tr.evaluated.clear()
    out, diag = unseen_outcomes(cfg, tr, world, [new], {"fedtreelora": {"algo": algo, "state": state, "lr": 0.1}})
    assert set(out) == {"fedtreelora"} and out["fedtreelora"].shape == (5,) and diag == {"unseen_placement": 1.0}
    start = {k: state["messages"][2]["clus/" + k].astype(np.float64) for k in tr.keys}
    (seen,) = tr.evaluated
    for k in tr.keys:   # two fine-tuning rounds of one 10 % step each, from the block's cluster expert
        t = new.train[0][k].astype(np.float64)
        np.testing.assert_allclose(seen[k], t + 0.9 ** 2 * (start[k] - t), rtol=1e-5, atol=1e-6)


def test_unseen_fedavg_ft_fine_tunes_fedavgs_model_for_all_rounds_and_local_starts_from_scratch():
    import dataclasses

    from icml26.fedtreelora.baselines import FedAvgLoRA, LocalLoRA
    from icml26.fedtreelora.experiment import unseen_outcomes

    rng = np.random.default_rng(5)
    tr = BatchedLinearTrainer()
    clients = _clients(tr, rng)
    kw = dict(train_rounds=2, local_steps=1, lr=0.1, seed=3)
    fedavg = FedAvgLoRA(tr, **kw)
    state = run_in_process(fedavg, clients)
    new = _clients(tr, rng, n=1)[0]
    new.cid = 9
    cfg = dataclasses.replace(PRESETS["smoke"], warmup_rounds=1, ft_rounds=2)
    chosen = {"fedavg_lora": {"algo": fedavg, "state": state, "lr": 0.1}, "fedavg_ft": {"lr": 0.1},
              "local": {"algo": LocalLoRA(tr, **kw), "state": {}, "lr": 0.1}}
    tr.evaluated.clear()
    out, _ = unseen_outcomes(cfg, tr, None, [new], chosen)
    assert set(out) == {"fedavg_ft", "local"}
    seen_ft, seen_local = tr.evaluated          # UNSEEN_ARMS order: fedavg_ft before local
    init = tr.init_state()
    for k in tr.keys:   # warm-up + fine-tuning rounds (1 + 2) of one 10 % step each
        t = new.train[0][k].astype(np.float64)
        glob = state["messages"][0]["clus/" + k].astype(np.float64)
        np.testing.assert_allclose(seen_ft[k], t + 0.9 ** 3 * (glob - t), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(seen_local[k], t + 0.9 ** 3 * (init[k] - t), rtol=1e-5, atol=1e-6)
