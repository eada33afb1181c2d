"""``FedTreeLoRAStrategy`` inside a user's own ``ServerApp`` with a stock ``ClientApp``
(``test_strategy_user_app.py``): the arrays and config of ``start()`` reach the clients, each node gets its own
cluster and external experts (checked against hand-computed weighted means of what the clients sent), the
global arrays are the round's weighted mean, ``fraction_train`` sampling, failed and silent nodes under the
failure policy, bad arguments; with the library's ClientApp the strategy reproduces ``run_in_process``; slow:
Flower's simulation engine and ``flwr run`` on a local SuperLink.

Central functions: ``FedTreeLoRAStrategy.configure_train`` / ``aggregate_train`` / ``personal_arrays`` /
``build``, ``common.federation.sample_nodes``, ``strategy.reply_problem``."""

from __future__ import annotations

import shutil
import tomllib
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("flwr")

from flwr.app import Array, ArrayRecord, Message, RecordDict

from icml26.common.federation import sample_nodes
from icml26.fedtreelora.strategy import FedTreeLoRAStrategy

from ..flower_grid import RecordingGrid, user_app_pyproject
from . import test_strategy_user_app as user

USER_MODULE = Path(user.__file__)
LORA = [k for k in user.KEYS if "lora_" in k]



def _run(strategy, rounds=3, n=4, run_config=None, silent=None, lr=0.5, arrays=None):
    from flwr.app import ConfigRecord

    grid = RecordingGrid(user.client_app, n, run_config or {}, silent)
    init = arrays or user.initial_arrays()
    result = strategy.start(grid=grid, initial_arrays=ArrayRecord({k: Array(v) for k, v in init.items()}),
                            num_rounds=rounds, timeout=5.0, train_config=ConfigRecord({"lr": lr}))
    return grid, result


def _mean(arrays, weights):
    w = np.asarray(weights, dtype=np.float64)
    return sum(wi * np.asarray(a, dtype=np.float64) for a, wi in zip(arrays, w, strict=True)) / w.sum()


# ------------------------------------------------------------------------------------------------ the contract
def test_user_server_app_runs_the_strategy_with_a_stock_client_app(task_identity):
    """The user's ServerApp (``test_strategy_user_app.main``) through a Grid, then the strategy's messages
    against hand-computed means of what the stock clients sent."""
    from flwr.app import Context as Ctx

    grid = RecordingGrid(user.client_app, 4, {})
    user.server_app(grid, Ctx(run_id=1, node_id=0, node_config={}, state=RecordDict(),
                              run_config={"num-server-rounds": 3, "lr": 0.25, "warmup-rounds": 1}))
    init = user.initial_arrays()
    # round 1: every node starts from the arrays of start(), with start()'s config (+ server-round)
    first = grid.sent("train", 1)
    assert sorted(first) == [100, 101, 102, 103]
    for msg in first.values():
        assert all(np.array_equal(msg.content["arrays"][k].numpy(), init[k]) for k in user.KEYS)
        assert dict(msg.content["config"]) == {"lr": 0.25, "server-round": 1}
        assert "external" not in msg.content.array_records
    assert all(m.content["metrics"]["lr-seen"] == 0.25 for r in (1, 2, 3) for m in grid.got("train", r).values())
    # round 2 (after the tree of round 1): node 100's layer-1 cluster is {100, 101}, its layer-0 cluster everyone
    got, second = grid.got("train", 1), grid.sent("train", 2)
    w = {n: user.n_examples(n - 100) for n in got}
    mine = second[100].content
    b1, b0 = LORA[3], LORA[1]
    np.testing.assert_allclose(mine["arrays"][b1].numpy(),
                               _mean([got[n].content["arrays"][b1].numpy() for n in (100, 101)], [w[100], w[101]]),
                               rtol=1e-6)
    np.testing.assert_allclose(mine["external"][b1].numpy(),
                               _mean([got[n].content["arrays"][b1].numpy() for n in (102, 103)], [w[102], w[103]]),
                               rtol=1e-6)
    np.testing.assert_allclose(mine["arrays"][b0].numpy(),
                               _mean([got[n].content["arrays"][b0].numpy() for n in got], list(w.values())), rtol=1e-6)
    assert b0 not in mine["external"]                       # one cluster at layer 0: no external expert
    # the non-LoRA head is FedAvg's weighted mean for everyone
    head = _mean([got[n].content["arrays"]["head.weight"].numpy() for n in got], list(w.values()))
    for msg in second.values():
        np.testing.assert_allclose(msg.content["arrays"]["head.weight"].numpy(), head, rtol=1e-6)


def test_the_tree_global_arrays_and_metrics_come_from_the_replies(task_identity):
    strategy = FedTreeLoRAStrategy(warmup_rounds=2, seed=0)
    grid, result = _run(strategy, rounds=3)
    tree = strategy.tree
    assert tree["ids"] == [100, 101, 102, 103] and tree["cuts"] == [1, 2]
    assert sorted(map(sorted, tree["partitions"][1])) == [[100, 101], [102, 103]]
    # no personalisation before the tree: round 2's message to a node is what it sent in round 1
    got1, sent2 = grid.got("train", 1), grid.sent("train", 2)
    for node, msg in sent2.items():
        for k in LORA:
            np.testing.assert_array_equal(msg.content["arrays"][k].numpy(), got1[node].content["arrays"][k].numpy())
    assert "external" not in sent2[100].content.array_records and "external" in grid.sent("train", 3)[100].content
    # Result.arrays: the last round's num-examples-weighted mean of every key, never empty
    last = grid.got("train", 3)
    assert sorted(result.arrays.keys()) == sorted(user.KEYS)
    for k in user.KEYS:
        np.testing.assert_allclose(result.arrays[k].numpy(),
                                   _mean([m.content["arrays"][k].numpy() for m in last.values()],
                                         [user.n_examples(n - 100) for n in last]), rtol=1e-6)
    assert result.train_metrics_clientapp[3]["lr-seen"] == pytest.approx(0.5)
    assert result.train_metrics_clientapp[3]["aggregated-nodes"] == 4
    # per-client evaluation of the personalised models: layer-1 experts fit their half's target
    assert set(strategy.evaluations[3]) == {100, 101, 102, 103}
    assert strategy.evaluations[3][100]["target-error"] < strategy.evaluations[1][100]["target-error"]


def test_start_arrays_and_config_are_what_the_clients_get(task_identity):
    init = {k: np.full_like(v, 0.5) for k, v in user.initial_arrays().items()}
    grid, _ = _run(FedTreeLoRAStrategy(seed=1), rounds=1, lr=0.125, arrays=init)
    for msg in grid.sent("train", 1).values():
        assert all(np.array_equal(msg.content["arrays"][k].numpy(), init[k]) for k in user.KEYS)
        assert msg.content["config"]["lr"] == 0.125
    for node, reply in grid.got("train", 1).items():            # B moved 1/8 of the way from 0.5 to its target
        b = LORA[1]
        want = 0.5 + 0.125 * (user.target(b, node - 100) - 0.5)
        np.testing.assert_allclose(reply.content["arrays"][b].numpy(), want, rtol=1e-6)


def test_fraction_train_samples_that_many_nodes_seeded(task_identity):
    strategy = FedTreeLoRAStrategy(fraction_train=0.5, min_train_nodes=1, min_available_nodes=4, seed=3,
                                   fraction_evaluate=0.25, min_evaluate_nodes=1)
    grid, _ = _run(strategy, rounds=4)
    picks = [sorted(grid.sent("train", r)) for r in range(1, 5)]
    assert all(len(p) == 2 for p in picks) and len({tuple(p) for p in picks}) > 1
    assert [h["sampled"] for h in strategy.history] == picks
    assert len(grid.all_sent("evaluate")) == 4
    again, _ = _run(FedTreeLoRAStrategy(fraction_train=0.5, min_train_nodes=1, min_available_nodes=4, seed=3,
                                        fraction_evaluate=0.25, min_evaluate_nodes=1), rounds=4)
    assert [sorted(again.sent("train", r)) for r in range(1, 5)] == picks
    # min_train_nodes wins over a small fraction, as in FedAvg
    nodes, everyone = sample_nodes(RecordingGrid(user.client_app, 4, {}), 0.1, 3, 2, __import__("random").Random(0))
    assert len(nodes) == 3 and everyone == [100, 101, 102, 103]


def test_failed_and_silent_nodes_are_dropped_and_a_short_round_is_skipped(task_identity):
    """Round 2: client 2 raises and client 1's reply never comes: aggregated over 0 and 3. Round 3: client 2
    raises again and 0, 1 are silent: one reply, fewer than min_train_replies=2: skipped, nothing changes."""
    silent = {("train", 2): {1}, ("train", 3): {0, 1}}
    strategy = FedTreeLoRAStrategy(warmup_rounds=1, min_train_replies=2, seed=0)
    grid, result = _run(strategy, rounds=3, run_config={"fail-ids": "[2]", "fail-round": 2}, silent=silent)
    h = strategy.history
    assert h[1]["aggregated"] == [100, 103] and not h[1]["skipped"]
    assert h[1]["failed"] == {101: "did not answer", 102: "raised: client 2 went away"}
    assert h[2]["aggregated"] == [103] and h[2]["skipped"]
    # round 2's cluster expert of node 100 at layer 1 averages 100's new factors with 101's last (round 1) ones
    b1 = LORA[3]
    got1, got2 = grid.got("train", 1), grid.got("train", 2)
    want = _mean([got2[100].content["arrays"][b1].numpy(), got1[101].content["arrays"][b1].numpy()], [10, 20])
    np.testing.assert_allclose(grid.sent("train", 3)[100].content["arrays"][b1].numpy(), want, rtol=1e-6)
    # the skipped round leaves the global arrays at round 2's weighted mean over 100 and 103
    assert 3 not in result.train_metrics_clientapp
    np.testing.assert_allclose(result.arrays[b1].numpy(),
                               _mean([got2[n].content["arrays"][b1].numpy() for n in (100, 103)], [10, 40]), rtol=1e-6)
    np.testing.assert_allclose(strategy.personal[100]["clus"][b1], want, rtol=1e-6)


def test_malformed_replies_are_dropped(task_identity):
    from icml26.fedtreelora.strategy import reply_problem

    def reply(arrays, metrics):
        from flwr.app import MetricRecord

        rec = RecordDict({"arrays": ArrayRecord({k: Array(v) for k, v in arrays.items()}),
                          "metrics": MetricRecord(metrics)})
        return Message(rec, dst_node_id=0, message_type="train")

    ok = {"a.0.lora_A.weight": np.ones((2, 2), np.float32)}
    assert reply_problem(reply(ok, {"num-examples": 3}), "num-examples", ["a.0.lora_A.weight"]) is None
    assert "NaN" in reply_problem(reply({"a.0.lora_A.weight": np.full((2, 2), np.nan, np.float32)},
                                        {"num-examples": 3}), "num-examples", None)
    assert "num-examples" in reply_problem(reply(ok, {"num-examples": 0}), "num-examples", None)
    assert "differ" in reply_problem(reply(ok, {"num-examples": 3}), "num-examples", ["b.0.lora_A.weight"])


@pytest.mark.parametrize("kwargs, name", [
    (dict(fraction_train=1.5), "fraction_train"), (dict(fraction_evaluate=-0.1), "fraction_evaluate"),
    (dict(fraction_train=True), "fraction_train"), (dict(min_train_nodes=-1), "min_train_nodes"),
    (dict(min_evaluate_nodes=1.5), "min_evaluate_nodes"), (dict(min_available_nodes=-2), "min_available_nodes"),
    (dict(min_train_replies=0), "min_train_replies"), (dict(warmup_rounds=0), "warmup_rounds"),
    (dict(distance="l1"), "distance"), (dict(linkage="ward2"), "linkage"), (dict(cut_rule="deep"), "cut_rule"),
    (dict(cut_rule="fixed", fixed_k=0), "fixed_k"), (dict(tau=1.5), "tau"), (dict(window=0), "window"),
    (dict(weighted_by_key=""), "weighted_by_key"), (dict(external_key="arrays"), "external_key"),
])
def test_bad_arguments_name_themselves(kwargs, name):
    with pytest.raises(ValueError, match=name):
        FedTreeLoRAStrategy(**kwargs)


# ------------------------------------------------------------------------- the library's ClientApp (an oracle)
@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    pytest.importorskip("transformers")
    from icml26.common.tiny_lm import char_tokenizer, save_lab_model, tiny_causal_lm
    from icml26.fedtreelora.client import LoRATrainer
    from icml26.fedtreelora.data import World, make_clients

    tok = char_tokenizer()
    base = tiny_causal_lm(len(tok), hidden=16, layers=2, heads=2, kv_heads=1, intermediate=32, max_positions=16,
                          seed=0)
    path = save_lab_model(base, tok, tmp_path_factory.mktemp("base"))
    trainer = LoRATrainer.from_pretrained(path, r=2, alpha=4, batch_size=8)
    return trainer, make_clients(World(per_rule=1), tok, n_train=16, n_val=8, n_test=12, seed=0)


def test_with_the_library_client_app_the_strategy_reproduces_run_in_process(lab, task_identity):
    from icml26.common.federation import run_in_process
    from icml26.fedtreelora.core import FedTreeLoRA
    from icml26.fedtreelora.strategy import client_app

    trainer, clients = lab
    clients = clients[:3]
    algo = FedTreeLoRA(trainer, train_rounds=3, local_steps=2, lr=0.05, warmup_rounds=1, seed=1)
    strategy = FedTreeLoRAStrategy.from_algorithm(algo, min_train_nodes=3, min_evaluate_nodes=3)
    grid = RecordingGrid(client_app(algo, lambda c: clients[c]), len(clients), {})
    result = strategy.start(grid=grid, initial_arrays=ArrayRecord({k: Array(v) for k, v in trainer.init_state().items()}),
                            num_rounds=algo.train_rounds)
    local = run_in_process(algo, clients)
    assert strategy.tree["cuts"] == local["log"]["cuts"]
    assert [sorted(sorted(n - 100 for n in b) for b in p) for p in strategy.tree["partitions"]] == \
        [sorted(sorted(b) for b in p) for p in local["log"]["partitions"]]
    for k in range(3):                                      # the same personalised models, client by client
        ev = strategy.evaluations[algo.train_rounds][100 + k]
        assert ev["test-accuracy"] == pytest.approx(float(np.mean(local["test"][k])), abs=1e-12)
        assert ev["val-accuracy"] == pytest.approx(float(np.mean(local["val"][k])), abs=1e-12)
        for key, value in local["messages"][k].items():     # the last round's experts, key by key
            name = key.split("/", 1)[1]
            mine = strategy.personal[100 + k]["clus" if key.startswith("clus/") else "ext"][name]
            np.testing.assert_array_equal(mine, value)
    assert len(result.arrays) == len(trainer.keys)
    with pytest.raises(TypeError, match="FedTreeLoRA"):
        FedTreeLoRAStrategy.from_algorithm(object())


# ------------------------------------------------------------------------------------------ real Flower runs
@pytest.mark.slow
def test_the_user_apps_run_in_flower_simulation():
    """Flower's simulation engine (``run_simulation``, Ray; deprecated in Flower 1.42 in favour of ``flwr run``, the
    next test): four virtual SuperNodes, two rounds."""
    from flwr.simulation import run_simulation

    user.LAST.clear()
    run_simulation(server_app=user.server_app, client_app=user.client_app, num_supernodes=4,
                   backend_config={"client_resources": {"num_cpus": 1}, "init_args": {"num_cpus": 2}})
    out = user.LAST
    assert out["tree"]["cuts"] == [1, 2] and sorted(out["arrays"]) == sorted(user.KEYS)
    assert [len(h["aggregated"]) for h in out["history"]] == [4, 4]
    # the layer-1 clusters are the planted halves (partition ids unknown to the strategy: checked by size)
    assert sorted(len(b) for b in out["tree"]["partitions"][1]) == [2, 2]


@pytest.mark.slow
def test_the_user_apps_run_with_flwr_run(tmp_path):
    """``flwr run`` of a user's app directory (this module and a pyproject.toml) on a local SuperLink, four
    simulated SuperNodes, client 3 failing from round 2: aggregated without it."""
    from icml26.common.federation import LocalFederation

    project = tmp_path / "user_app"
    project.mkdir()
    shutil.copy(USER_MODULE, project / "userapp.py")
    (project / "pyproject.toml").write_text(PYPROJECT)
    assert tomllib.loads(PYPROJECT)["tool"]["flwr"]["app"]["components"]["serverapp"] == "userapp:server_app"
    with LocalFederation(home=tmp_path / "flower") as federation:
        outcome = federation.run(project, {"fail-ids": "[3]", "fail-round": 2}, num_supernodes=4, timeout=600)
    result = outcome.result
    assert result["history"][0]["aggregated"] == sorted(result["tree"]["ids"])
    assert len(result["history"][1]["aggregated"]) == 3 and len(result["history"][1]["failed"]) == 1
    assert sorted(result["arrays"]) == sorted(user.KEYS) and result["tree"]["cuts"] == [1, 2]


PYPROJECT = user_app_pyproject("""
num-server-rounds = 2
warmup-rounds = 1
lr = 0.5
seed = 0
timeout = 120.0
fail-ids = "[]"
fail-round = 1
result-path = ""
""")
