"""FedTreeLoRA on Flower: the App project's run config and client data; the harness's real ServerApp and
ClientApp exchanging real Flower messages (in this process, through Flower's wire format) bit-identical to the
in-process runner (``FedTreeLoRAStrategy`` in a user's ServerApp: ``test_strategy_flower.py``); and (slow) a
real ``flwr run`` on a local SuperLink agreeing with the in-process runner."""

from __future__ import annotations

import pickle
import tomllib
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("flwr")
pytest.importorskip("transformers")

from flwr.app import Context, RecordDict

from icml26.common.federation import FailurePolicy, run_in_process
from icml26.fedtreelora import flower as app
from icml26.fedtreelora.baselines import (
    Ditto,
    FedAvgFT,
    FedSALoRA,
    FixedDepthLoRA,
    FlatClusterLoRA,
    OracleClusterLoRA,
)
from icml26.fedtreelora.core import FedTreeLoRA, layer_index
from icml26.fedtreelora.data import World, make_clients

from ..flower_grid import InlineGrid


def _app_config() -> dict:
    return tomllib.loads((app.APP_DIR / "pyproject.toml").read_text())["tool"]["flwr"]["app"]


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    from icml26.common.tiny_lm import char_tokenizer, save_lab_model, tiny_causal_lm
    from icml26.fedtreelora.client import LoRATrainer

    tok = char_tokenizer()
    base = tiny_causal_lm(len(tok), hidden=16, layers=2, heads=2, kv_heads=1, intermediate=32, max_positions=16,
                          seed=0)
    path = save_lab_model(base, tok, tmp_path_factory.mktemp("base"))
    trainer = LoRATrainer.from_pretrained(path, r=2, alpha=4, batch_size=8)
    clients = make_clients(World(per_rule=1), tok, n_train=16, n_val=8, n_test=12, seed=0)
    return path, trainer, clients


def _same(got, want, where=""):
    if isinstance(want, dict):
        assert isinstance(got, dict) and sorted(got, key=str) == sorted(want, key=str), where
        for k in want:
            _same(got[k], want[k], f"{where}/{k}")
    elif isinstance(want, np.ndarray):
        assert np.asarray(got).dtype == want.dtype and np.array_equal(got, want), where
    elif isinstance(want, (list, tuple)) and want and isinstance(want[0], np.ndarray):
        assert len(got) == len(want)
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            _same(g, w, f"{where}[{i}]")
    else:
        assert got == want, where


def _same_run(got, want):
    """Bit-identical runs: per-client messages (adapters), outcomes, gates, bytes, tree and cuts."""
    for key in ("messages", "val", "test", "mix", "bytes_up", "bytes_down"):
        _same(got[key], want[key], key)
    if want["log"]:
        assert got["log"]["cuts"] == want["log"]["cuts"] and got["log"]["partitions"] == want["log"]["partitions"]
        np.testing.assert_array_equal(got["log"]["linkage"], want["log"]["linkage"])


# ------------------------------------------------------------------------------------------- config and data
def test_app_project_names_the_apps_and_declares_every_key_the_runner_sets(lab):
    path, trainer, _ = lab
    config = _app_config()
    assert config["components"] == {"serverapp": "icml26.fedtreelora.flower:server_app",
                                    "clientapp": "icml26.fedtreelora.flower:client_app"}
    kw = dict(train_rounds=4, local_steps=3, lr=0.02, seed=5)
    algos = [FedTreeLoRA(trainer, warmup_rounds=2, tau=0.1, window=2, gate_lr=None, gate_init=0.7,
                         distance="frobenius", cut_rule="fixed", fixed_k=2, external=False, **kw),
             FedSALoRA(trainer, **kw), FixedDepthLoRA(trainer, share_layers=1, **kw),
             FlatClusterLoRA(trainer, warmup_rounds=1, tau=0.3, **kw), OracleClusterLoRA(trainer, labels=[0, 1, 1, 0], **kw),
             FedAvgFT(trainer, ft_rounds=2, **kw), Ditto(trainer, lam=0.3, **kw)]
    for algo in algos:
        overrides = app.run_config_of(algo, 4, FailurePolicy(min_replies=3, timeout=30.0))
        # flwr run refuses a run-config key the app's pyproject does not declare
        assert set(overrides) | {"data-dir", "result-path"} <= set(config["config"])
        back = app.algorithm_from_run_config({**config["config"], **overrides})
        assert type(back) is type(algo)
        skip = {"trainer"}
        assert {k: v for k, v in vars(back).items() if k not in skip and k != "labels"} == \
            {k: v for k, v in vars(algo).items() if k not in skip and k != "labels"}
        if isinstance(algo, OracleClusterLoRA):
            np.testing.assert_array_equal(back.labels, algo.labels)
        assert back.trainer.keys == trainer.keys and back.trainer.model_path == str(Path(path).resolve())
        assert FailurePolicy.from_run_config(overrides) == FailurePolicy(min_replies=3, timeout=30.0)
    with pytest.raises(ValueError, match="arm must be one of"):
        app.algorithm_from_run_config({**config["config"], "arm": "fedprox"})
    with pytest.raises(ValueError, match="target-modules must be a non-empty JSON list"):
        app.algorithm_from_run_config({**config["config"], "target-modules": "q_proj"})
    with pytest.raises(ValueError, match="model-path is empty"):
        app.algorithm_from_run_config({**config["config"], "model-path": ""})
    with pytest.raises(TypeError, match="algorithm must be one of"):
        app.run_config_of(object(), 2)


def test_a_client_loads_only_its_own_file_and_names_it_when_bad(lab, tmp_path):
    clients = lab[2]
    paths = app.write_clients(clients[:2], tmp_path)
    got = app.load_client(1, {}, {"data-dir": str(tmp_path)})
    for split in ("train", "val", "test"):
        for g, w in zip(getattr(got, split), getattr(clients[1], split), strict=True):
            assert g.dtype == w.dtype and np.array_equal(g, w)
    assert got.spec == clients[1].spec
    # a SuperNode's own data-path wins over the run config
    assert app.load_client(1, {"data-path": str(paths[0])}, {"data-dir": str(tmp_path)}).cid == 0
    # a file needs only its training split; its cid is then its partition id
    np.savez(tmp_path / "bare.npz", train_x=np.ones((4, 11), np.int64), train_y=np.array([0, 1, 1, 0]))
    bare = app.load_client(5, {"data-path": str(tmp_path / "bare.npz")}, {})
    assert (bare.cid, bare.n_train, bare.test[0].shape) == (5, 4, (0, 11))
    np.savez(tmp_path / "float_labels.npz", train_x=np.ones((2, 11), np.int64), train_y=np.array([0.0, 1.0]))
    with pytest.raises(ValueError, match=r"float_labels\.npz: train_x must hold token ids and train_y class labels"):
        app.load_client(0, {"data-path": str(tmp_path / "float_labels.npz")}, {})
    np.savez(tmp_path / "no_labels.npz", train_x=np.ones((2, 11), np.int64))
    with pytest.raises(ValueError, match=r"no_labels\.npz: needs the arrays train_x and train_y"):
        app.load_client(0, {"data-path": str(tmp_path / "no_labels.npz")}, {})
    with pytest.raises(ValueError, match="no data for this client"):
        app.load_client(0, {}, {"data-dir": ""})
    with pytest.raises(ValueError, match="outside the demo world of 8 clients"):
        app.load_client(8, {}, {"data-dir": "demo"})


# ------------------------------------------------------------------------- the apps, through Flower messages


def test_the_apps_exchange_flower_messages_bit_identical_to_in_process(lab, task_identity, tmp_path):
    _, trainer, clients = lab
    clients = clients[:3]
    algo = FedTreeLoRA(trainer, train_rounds=3, local_steps=2, lr=0.05, warmup_rounds=1, seed=1)
    run_config = {**_app_config()["config"], **app.run_config_of(algo, len(clients)), "data-dir": str(tmp_path),
                  "result-path": str(tmp_path / "outcome.pkl")}
    app.write_clients(clients, tmp_path)
    app.server_app(InlineGrid(app.client_app, len(clients), run_config),
                   Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=run_config))
    with open(tmp_path / "outcome.pkl", "rb") as fh:
        outcome = pickle.load(fh)
    local, log = run_in_process(algo, clients, transcript=True)
    _same_run(outcome["result"], local)
    flower = outcome["transcript"]
    assert flower.failures == [{}] * 4 and flower.lost_nodes == []
    for got, want in zip(flower.replies, log.replies, strict=True):        # only adapters, counts, outcomes
        _same(got, want)
    # every node got its own message: after the tree, clients of different clusters get different experts
    last = flower.messages[-2]
    cut = local["log"]["partitions"][-1]
    if len(cut) > 1:
        a, b = (min(block) for block in cut[:2])
        deepest = max(layer_index(k) for k in last[a] if k.startswith("clus/"))
        key = next(k for k in last[a] if k.startswith("clus/") and layer_index(k) == deepest)
        assert not np.array_equal(last[a][key], last[b][key])


# ------------------------------------------------------------------------------------------ real Flower runs
@pytest.mark.slow
def test_a_flower_run_agrees_with_the_in_process_runner(lab, tmp_path):
    """``flwr run`` of FedTreeLoRA's App project on a local SuperLink (simulation engine, three SuperNodes);
    about a minute on two loaded cores (Ray starts first)."""
    _, trainer, clients = lab
    clients = clients[:3]
    algo = FedTreeLoRA(trainer, train_rounds=3, local_steps=2, lr=0.05, warmup_rounds=1, seed=1)
    outcome = app.run_local(algo, clients, home=tmp_path / "flower")
    local, log = run_in_process(algo, clients, transcript=True)
    _same_run(outcome.result, local)
    for got, want in zip(outcome.transcript.replies, log.replies, strict=True):
        _same(got, want)
    assert outcome.transcript.failures == [{}] * 4 and outcome.transcript.lost_nodes == []
    logs = "".join(p.read_text(errors="replace") for p in (tmp_path / "flower").rglob("*.log"))
    assert "DEPRECATED" not in logs
