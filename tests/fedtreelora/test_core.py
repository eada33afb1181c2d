"""FedTreeLoRA's core (numpy / scipy / sklearn) against the literal float64 transcription in ``reference.py``.

The paper's central functions and the fast tests that guard each (a plausible bug in any of them is a mutant in
``mutants.toml`` that one of these kills):

- ``layer_distances`` (1 - cos of the B matrices, per layer): ``test_layer_distances_match_the_reference``,
  ``test_zero_B_is_guarded``.
- ``build_client_tree`` and ``FedTreeLoRA.build`` (the one tree, from the uploaded **B** matrices averaged over
  **all** layers): ``test_the_tree_is_built_from_the_uploaded_B_matrices_averaged_over_layers``,
  ``test_tree_cuts_match_naive_average_linkage``.
- ``select_layer_cuts`` (monotone per-layer counts, each layer scored on its own D^(l)):
  ``test_layer_cuts_match_the_reference_and_are_monotone``, ``test_planted_hierarchy_gives_trunk_and_branches``
  (also ``tree_partitions``, ``flat_partition``, ``independent_partitions``).
- ``aggregate_tree_lora`` (cluster and external experts): ``test_aggregation_matches_the_reference``.
- ``FederatedLoRA`` client side (private adapters and gates persist across rounds, example-weighted uploads,
  per-round batch seeds): ``test_private_adapters_persist_across_rounds``,
  ``test_private_adapters_persist_across_rounds_in_both_runners`` (the harness's runner and ``run_batched``),
  ``test_protocol_messages_follow_each_sharing_rule``,
  ``test_fedtreelora_protocol_warms_up_then_sends_cluster_and_external_experts``.
- The mixed LoRA layer (``module.py``): ``test_module.py``; the two runners on a real tiny model:
  ``test_runners.py``; Flower: ``test_flower.py``.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from icml26.common.federation import run_in_process
from icml26.fedtreelora import reference as ref
from icml26.fedtreelora.baselines import (
    FedAvgLoRA,
    FedSALoRA,
    FFALoRA,
    FixedDepthLoRA,
    LocalLoRA,
    OracleClusterLoRA,
)
from icml26.fedtreelora.core import (
    ClientTree,
    FedTreeLoRA,
    adjusted_rand,
    aggregate_tree_lora,
    build_client_tree,
    flat_partition,
    independent_partitions,
    layer_distances,
    layer_index,
    module_of,
    run_batched,
    select_layer_cuts,
    silhouette,
    tree_partitions,
)


def _random_B(rng, n=6, layers=3, modules=2, shape=(5, 2)):
    return {k: [[rng.normal(size=shape) for _ in range(modules)] for _ in range(layers)] for k in range(n)}


def _planted_B(rng, noise=0.05):
    """8 clients: layer 0 one direction for all, layer 1 two groups, layers 2-3 four groups nested in the two."""
    shared = rng.normal(size=(6, 2))
    two = rng.normal(size=(2, 6, 2))
    four = np.stack([two[s // 2] + 0.8 * rng.normal(size=(6, 2)) for s in range(4)])
    out = {}
    for k in range(8):
        layers = [shared, two[k // 4], four[k // 2], four[k // 2]]
        out[k] = [[m + noise * rng.normal(size=m.shape)] for m in layers]
    return out


def test_layer_distances_match_the_reference():
    rng = np.random.default_rng(0)
    B = _random_B(rng)
    np.testing.assert_allclose(layer_distances(B), ref.layer_distances(B), atol=1e-12)
    D = layer_distances(B, "frobenius")
    i, j = 1, 4
    by_hand = np.mean([np.linalg.norm(B[i][0][m] - B[j][0][m]) for m in range(2)])
    assert D[0, i, j] == pytest.approx(by_hand, rel=1e-10)


def test_zero_B_is_guarded():
    B = {0: [[np.zeros((3, 2))]], 1: [[np.ones((3, 2))]], 2: [[np.ones((3, 2))]]}
    D = layer_distances(B)
    assert np.all(np.isfinite(D)) and D[0, 0, 1] == pytest.approx(1.0) and D[0, 1, 2] == pytest.approx(0.0)


@pytest.mark.parametrize("seed", range(5))
def test_tree_cuts_match_naive_average_linkage(seed):
    rng = np.random.default_rng(seed)
    B = _random_B(rng, n=7)
    tree = build_client_tree(B)
    naive = ref.upgma_partitions(tree.distances)
    for c in range(1, 8):
        assert sorted(map(sorted, tree.partition(c))) == sorted(map(sorted, naive[c])), c


@pytest.mark.parametrize("seed", range(5))
def test_silhouette_matches_its_definition(seed):
    rng = np.random.default_rng(seed)
    D = layer_distances(_random_B(rng, n=7))[0]
    labels = np.array([0, 0, 1, 1, 1, 2, 2])
    part = [frozenset(np.flatnonzero(labels == g).tolist()) for g in range(3)]
    assert silhouette(D, labels) == pytest.approx(ref.silhouette(D, part), abs=1e-12)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize(("tau", "window"), [(0.2, 3), (0.0, 2), (0.4, 4), (-0.1, 1)])
def test_layer_cuts_match_the_reference_and_are_monotone(seed, tau, window):
    rng = np.random.default_rng(seed)
    B = _planted_B(rng, noise=0.6) if seed % 2 else _random_B(rng, n=8, layers=4)
    tree = build_client_tree(B)
    cuts = select_layer_cuts(tree, tau=tau, window=window)
    assert cuts == ref.layer_cuts(tree.layer_distances, tau, window)
    assert all(a <= b for a, b in itertools.pairwise(cuts))      # shared trunk, then branches
    assert all(1 <= c < 8 for c in cuts)                          # never every client alone
    assert all(b - a < window for a, b in itertools.pairwise([1, *cuts]))  # the window


def test_planted_hierarchy_gives_trunk_and_branches():
    rng = np.random.default_rng(3)
    B = _planted_B(rng)
    tree = build_client_tree(B)
    assert select_layer_cuts(tree, tau=0.2, window=3) == [1, 2, 4, 4]
    parts = tree_partitions(tree, [1, 2, 4, 4])
    assert sorted(map(sorted, parts[1])) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert sorted(map(sorted, parts[3])) == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert adjusted_rand([0, 0, 1, 1, 2, 2, 3, 3], tree.cut(4)) == pytest.approx(1.0)
    # the window limits the growth: from 1 cluster, K = 2 reaches at most 2 in the next layer
    assert select_layer_cuts(tree, tau=0.2, window=2) == [1, 2, 3, 4]
    c, part = flat_partition(tree, tau=0.2)
    assert c in (2, 4) and len(part) == c
    ind_cuts, _ = independent_partitions(tree.layer_distances, tree.ids, tau=0.2)
    assert ind_cuts[1:] == [2, 4, 4]
    # layer 0 is noise around one shared direction: clustered alone it shows spurious clusters (here 4) that
    # the shared tree does not reward ("topological drift", the paper's ablation)
    assert ind_cuts[0] > 1


def test_aggregation_matches_the_reference():
    rng = np.random.default_rng(1)
    keys = [f"base_model.model.model.layers.{layer}.self_attn.{m}.lora_{f}.weight"
            for layer in range(2) for m in ("q_proj", "v_proj") for f in "AB"]
    states = {c: {k: rng.normal(size=(3, 4)).astype(np.float32) for k in keys} for c in range(5)}
    weights = {c: float(c + 1) for c in range(5)}
    partitions = {0: [frozenset(range(5))], 1: [frozenset({0, 3}), frozenset({1, 2, 4})]}
    out = aggregate_tree_lora(states, partitions, weights)
    everyone = frozenset(range(5))
    for c in range(5):
        for k in keys:
            block = next(b for b in partitions[layer_index(k)] if c in b)
            np.testing.assert_allclose(out[c]["clus"][k], ref.expert_means(states, block, weights, k), rtol=1e-6)
            if block == everyone:
                assert k not in out[c]["ext"]      # a layer shared by all has no external expert
            else:
                np.testing.assert_allclose(out[c]["ext"][k], ref.expert_means(states, everyone - block, weights, k),
                                           rtol=1e-6)
    no_ext = aggregate_tree_lora(states, partitions, weights, external=False)
    assert all(not no_ext[c]["ext"] for c in range(5))


def test_bad_inputs_are_named():
    rng = np.random.default_rng(0)
    B = _random_B(rng, n=4)
    with pytest.raises(ValueError, match="distance"):
        layer_distances(B, "euclid")
    bad_rank = {**B, 3: [[rng.normal(size=(5, 3)) for _ in range(2)] for _ in range(3)]}
    with pytest.raises(ValueError, match="mismatched LoRA ranks or target modules"):
        layer_distances(bad_rank)
    bad_modules = {**B, 3: [[rng.normal(size=(5, 2))] for _ in range(3)]}
    with pytest.raises(ValueError, match="mismatched LoRA ranks or target modules"):
        layer_distances(bad_modules)
    nan = {**B, 2: [[np.full((5, 2), np.nan) for _ in range(2)] for _ in range(3)]}
    with pytest.raises(ValueError, match="NaN"):
        layer_distances(nan)
    tree = build_client_tree(B)
    with pytest.raises(ValueError, match="fewer clients than clusters"):
        tree.cut(5)
    with pytest.raises(ValueError, match="tau"):
        select_layer_cuts(tree, tau=float("nan"))
    with pytest.raises(ValueError, match="window"):
        select_layer_cuts(tree, window=0)
    key = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"
    with pytest.raises(ValueError, match="mismatched LoRA ranks"):
        aggregate_tree_lora({0: {key: np.ones((4, 3))}, 1: {key: np.ones((2, 3))}}, {0: [frozenset({0, 1})]})
    with pytest.raises(ValueError, match="mismatched target modules"):
        aggregate_tree_lora({0: {key: np.ones((4, 3))}, 1: {key.replace("q_proj", "k_proj"): np.ones((4, 3))}},
                            {0: [frozenset({0, 1})]})
    with pytest.raises(ValueError, match="does not cover"):
        aggregate_tree_lora({0: {key: np.ones((4, 3))}, 1: {key: np.ones((4, 3))}}, {0: [frozenset({0})]})
    with pytest.raises(ValueError, match="layer index"):
        layer_index("lora_A.weight")
    assert module_of(key) == "model.layers.0.self_attn.q_proj"


# ---------------------------------------------------------------------------------------- the protocol
class LinearTrainer:
    """A numpy stand-in for ``client.LoRATrainer``: one step moves every factor 10 % toward the client's target
    (train_A / train_B respected); correctness = 1 where the client's B mean is positive."""

    def __init__(self, layers=2, r=2, d=3):
        self.keys = [f"base_model.model.model.layers.{layer}.self_attn.{m}.lora_{f}.weight"
                     for layer in range(layers) for m in ("q_proj", "v_proj") for f in "AB"]
        self.layers = list(range(layers))
        self.shape = {k: (r, d) if k.endswith("lora_A.weight") else (d, r) for k in self.keys}
        self.calls = []

    def init_state(self):
        return {k: (np.full(self.shape[k], 0.5, np.float32) if "lora_A" in k else np.zeros(self.shape[k], np.float32))
                for k in self.keys}

    def train(self, data, clus, ext, mix, *, steps, lr, seed, train_A, train_B, gate_lr):
        self.calls.append((seed, sorted(ext)))
        target = data[0]
        out = {}
        for k, v in clus.items():
            move = ("lora_A" in k and train_A) or ("lora_B" in k and train_B)
            out[k] = (v + 0.1 * steps * (target[k] - v)).astype(np.float32) if move else np.asarray(v, np.float32)
        return out, {m: v + 1.0 for m, v in mix.items()}

    def correct(self, data, clus, ext, mix):
        return np.full(len(data[1]), float(np.mean([v.mean() for k, v in clus.items() if "lora_B" in k]) > 0))


class FakeClient:
    def __init__(self, cid, target, n=4):
        self.cid, self.n_train = cid, n
        self.train = (target, np.zeros(n))
        self.val = (None, np.zeros(3))
        self.test = (None, np.zeros(5))


def _clients(trainer, rng, n=4):
    return [FakeClient(c, {k: rng.normal(size=trainer.shape[k]).astype(np.float32) for k in trainer.keys})
            for c in range(n)]


def test_protocol_messages_follow_each_sharing_rule():
    rng = np.random.default_rng(0)
    tr = LinearTrainer()
    clients = _clients(tr, rng)
    kw = dict(train_rounds=3, local_steps=2, lr=0.1, seed=5)
    A = [k for k in tr.keys if "lora_A" in k]
    # FedAvg: everyone gets the same average of everything; FedSA: only A; FFA: only B, A never moves
    for algo, sent in ((FedAvgLoRA(tr, **kw), set(tr.keys)), (FedSALoRA(tr, **kw), set(A)),
                       (FFALoRA(tr, **kw), set(tr.keys) - set(A)), (LocalLoRA(tr, **kw), set()),
                       (FixedDepthLoRA(tr, share_layers=1, **kw), {k for k in tr.keys if ".layers.0." in k})):
        out, log = run_in_process(algo, clients, transcript=True)
        msg = log.messages[1]
        assert {k[len("clus/"):] for k in msg[0] if k.startswith("clus/")} == sent, algo.name
        for k in sent:
            np.testing.assert_array_equal(msg[0]["clus/" + k], msg[3]["clus/" + k])
        assert set(log.replies[0][0]) == {"lora/" + k for k in sent} | {"num_examples"}
        assert out["test"][2].shape == (5,)
    # the FedAvg aggregate is the example-weighted mean of the uploads, in float64
    clients[1].n_train = 12
    out, log = run_in_process(FedAvgLoRA(tr, **kw), clients, transcript=True)
    k = tr.keys[0]
    ups = [log.replies[0][c]["lora/" + k].astype(np.float64) for c in range(4)]
    w = np.array([4, 12, 4, 4], dtype=float)
    np.testing.assert_allclose(log.messages[1][0]["clus/" + k], (w[:, None, None] * np.stack(ups)).sum(0) / w.sum(),
                               rtol=1e-6)
    # bytes: every training round's uploads and downloads are counted
    per_client = sum(np.prod(tr.shape[k]) * 4 for k in tr.keys)
    assert out["bytes_up"] == [4 * per_client] * 3
    assert out["bytes_down"] == [0, 4 * per_client, 4 * per_client]


def test_fedtreelora_protocol_warms_up_then_sends_cluster_and_external_experts():
    rng = np.random.default_rng(2)
    tr = LinearTrainer()
    base = rng.normal(size=(3, 2))
    clients = []
    for c in range(4):  # two pairs with opposite B targets in layer 1, one shared target in layer 0
        target = {k: (base if ".layers.0." in k else (1 if c < 2 else -1) * base + 0.01 * rng.normal(size=(3, 2)))
                  if "lora_B" in k else np.full((2, 3), 0.5) for k in tr.keys}
        clients.append(FakeClient(c, {k: np.asarray(v, np.float32) for k, v in target.items()}))
    algo = FedTreeLoRA(tr, train_rounds=3, local_steps=1, lr=0.1, seed=1, warmup_rounds=1, tau=0.2, window=3)
    out, log = run_in_process(algo, clients, transcript=True)
    assert log.replies[0][0] != {} and all(k.startswith("lora/") or k == "num_examples" for k in log.replies[0][0])
    assert out["log"]["cuts"] == [1, 2]
    msg = log.messages[1][0]
    assert not any(k.startswith("ext/") and ".layers.0." in k for k in msg)      # trunk: no external expert
    assert any(k.startswith("ext/") and ".layers.1." in k for k in msg)          # branch: cluster + external
    # the client's gates start at logit(0.9) and are kept in its state
    seed, ext_keys = tr.calls[4]                    # client 0, round 2: the first round after the tree
    assert seed == (1, 0, 2) and ext_keys and all(".layers.1." in k for k in ext_keys)
    assert out["mix"][0] > 0.9
    with pytest.raises(ValueError, match="warmup_rounds"):
        FedTreeLoRA(tr, train_rounds=2, local_steps=1, lr=0.1, warmup_rounds=2)
    with pytest.raises(ValueError, match="fixed_k"):
        FedTreeLoRA(tr, train_rounds=2, local_steps=1, lr=0.1, warmup_rounds=1, cut_rule="fixed")
    with pytest.raises(ValueError, match="fixed_k=9 clusters but only 4 clients"):
        run_in_process(FedTreeLoRA(tr, train_rounds=2, local_steps=1, lr=0.1, warmup_rounds=1, cut_rule="fixed",
                                   fixed_k=9), clients)
    with pytest.raises(ValueError, match="lr"):
        FedTreeLoRA(tr, train_rounds=2, local_steps=1, lr=float("inf"), warmup_rounds=1)
    with pytest.raises(ValueError, match="planted labels"):
        run_in_process(OracleClusterLoRA(tr, labels=[0, 1], train_rounds=1, local_steps=1, lr=0.1), clients)


def test_a_client_without_data_is_refused():
    rng = np.random.default_rng(0)
    tr = LinearTrainer()
    clients = _clients(tr, rng)
    clients[2].n_train = 0
    with pytest.raises(ValueError, match="client 2 has no training data"):
        run_in_process(FedAvgLoRA(tr, train_rounds=1, local_steps=1, lr=0.1), clients)


def test_client_tree_holds_its_inputs():
    rng = np.random.default_rng(0)
    tree = build_client_tree(_random_B(rng, n=3))
    assert isinstance(tree, ClientTree) and tree.n == 3 and tree.linkage.shape == (2, 4)
    assert tree.cut(1).tolist() == [0, 0, 0] and sorted(tree.cut(3).tolist()) == [0, 1, 2]


def test_private_adapters_persist_across_rounds():
    # FedSA: B never leaves the client, so round 2 must start from round 1's B (each round moves 10 % of the way)
    rng = np.random.default_rng(4)
    tr = LinearTrainer()
    client = _clients(tr, rng, n=1)[0]
    algo = FedSALoRA(tr, train_rounds=2, local_steps=1, lr=0.1, seed=3)
    message = algo.configure(1, algo.initial_state([0]), [0])[0]
    _, state1 = algo.client_step(client, dict(message), {}, 1)
    _, state2 = algo.client_step(client, dict(message), state1, 2)
    for k in (k for k in tr.keys if "lora_B" in k):
        target = client.train[0][k].astype(np.float64)
        np.testing.assert_allclose(state1["own/" + k], 0.1 * target, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(state2["own/" + k], (1 - 0.9**2) * target, rtol=1e-5, atol=1e-6)
    assert all(state2["mix/" + m] == state1["mix/" + m] + 1.0 for m in algo.modules)  # the gates persist too


class BatchedLinearTrainer(LinearTrainer):
    """``LinearTrainer`` with ``client.BatchedLoRATrainer``'s batched interface; it records what each client's
    evaluation sees."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.evaluated = []

    def correct(self, data, clus, ext, mix):
        self.evaluated.append({k: np.asarray(v, np.float64) for k, v in clus.items()})
        return super().correct(data, clus, ext, mix)

    def train_many(self, datas, inputs, kwargs):
        return [self.train(d, *inp, **kw) for d, inp, kw in zip(datas, inputs, kwargs, strict=True)]

    def correct_many(self, datas, inputs):
        return [self.correct(d, *inp) for d, inp in zip(datas, inputs, strict=True)]


@pytest.mark.parametrize("runner", ["in_process", "batched"])
def test_private_adapters_persist_across_rounds_in_both_runners(runner):
    # FedSA-LoRA keeps B private: after R rounds of one 10 % step each, every client's B is (1 - 0.9^R) of its own
    # target, which is what its evaluation must see (a B reset each round would be 0.1 of it)
    rng = np.random.default_rng(6)
    tr = BatchedLinearTrainer()
    clients = _clients(tr, rng)
    algo = FedSALoRA(tr, train_rounds=3, local_steps=1, lr=0.1, seed=2)
    if runner == "batched":
        run_batched(algo, clients, tr)
    else:
        run_in_process(algo, clients)
    val = tr.evaluated[0::2] if runner == "in_process" else tr.evaluated[:len(clients)]   # val then test per client
    assert len(val) == len(clients)
    for client, seen in zip(clients, val, strict=True):
        for k in (k for k in tr.keys if "lora_B" in k):
            np.testing.assert_allclose(seen[k], (1 - 0.9**3) * client.train[0][k], rtol=1e-5, atol=1e-6)


def test_the_tree_is_built_from_the_uploaded_B_matrices_averaged_over_layers():
    """``FedTreeLoRA.build`` consumes what the paper says: the clients' LoRA B matrices (not A), 1 - cos per
    layer, averaged over every layer into D^glob; the tree, cuts and partitions equal reference.py's loops."""
    rng = np.random.default_rng(11)
    tr = LinearTrainer(layers=3)
    n = 6
    uploads = {c: {k: rng.normal(size=tr.shape[k]).astype(np.float32) for k in tr.keys} for c in range(n)}
    algo = FedTreeLoRA(tr, train_rounds=3, local_steps=1, lr=0.1, warmup_rounds=1, tau=0.0, window=3)
    log = algo.build(uploads)
    B = {c: [[uploads[c][k].astype(np.float64) for k in tr.keys if "lora_B" in k and f".layers.{layer}." in k]
             for layer in range(3)] for c in range(n)}
    Dl = ref.layer_distances(B)
    np.testing.assert_allclose(log["layer_distances"], Dl, atol=1e-12)
    naive = ref.upgma_partitions(Dl.mean(axis=0))                          # D^glob = mean over the layers
    for c in range(1, n + 1):
        assert sorted(map(sorted, log["tree"].partition(c))) == sorted(map(sorted, naive[c])), c
    assert log["cuts"] == ref.layer_cuts(Dl, 0.0, 3)
    assert [sorted(map(sorted, p)) for p in log["partitions"]] == [sorted(map(sorted, naive[c])) for c in log["cuts"]]
