"""xFedAlign on the federation harness: what leaves a client, parity with FedAvg, drops, poisoning, bad input."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from icml26.common.federation import run_in_process
from icml26.xfedalign import SparseArtifact, XFedAlign
from icml26.xfedalign.attacks import PoisonedXFedAlign
from icml26.xfedalign.baselines import FedAttrAgg, FedXAI
from icml26.xfedalign.core import FedTrain, make_artifact, params_of
from icml26.xfedalign.data import load_task, patch_groups
from icml26.xfedalign.models import ModelSpec


@pytest.fixture(scope="module")
def cancer():
    return load_task("cancer", "dirichlet", n_clients=4, seed=0)


def _algo(task, cls=XFedAlign, **kw):
    kw.setdefault("rounds", 2)
    return cls(ModelSpec(30, 2, 8), task.groups, topk=4, lr=0.05, **kw)


def test_xfedalign_trains_exactly_fedavgs_model(cancer):
    xfa = run_in_process(_algo(cancer), cancer.clients)
    plain = run_in_process(FedTrain(ModelSpec(30, 2, 8), rounds=2, lr=0.05), cancer.clients)
    for k in plain["params"]:
        np.testing.assert_array_equal(xfa["params"][k], plain["params"][k])
    assert xfa["prior"].shape == (2, 10) and np.allclose(xfa["prior"].sum(1), 1.0)
    again = run_in_process(_algo(cancer), cancer.clients)                 # same seed, same numbers
    np.testing.assert_array_equal(again["prior"], xfa["prior"])


def test_only_parameters_and_a_small_artifact_leave_a_client(cancer):
    _, transcript = run_in_process(_algo(cancer), cancer.clients, transcript=True)
    raw = np.concatenate([np.concatenate([c.X_train.ravel(), c.X_test.ravel()]) for c in cancer.clients])
    for rnd in transcript.replies:
        for cid, reply in rnd.items():
            explain = {k for k in reply if k.startswith("art_")}
            assert set(reply) - explain == {f"param/{k}" for k in ("0.weight", "0.bias", "2.weight", "2.bias")} | {
                "num_examples"}
            art = SparseArtifact.from_payload(reply)
            assert art.nbytes == 12 + 1 + 2 * 2 * 4                      # 29 bytes for C = 2, k = 4
            assert art.present.tolist() == (np.bincount(cancer.clients[cid].y_train, minlength=2) >= 1).tolist()
            assert ((art.dense() > 0).sum(axis=1) <= 4).all()             # at most k groups per class
            assert not np.isin(np.asarray(reply["param/0.bias"], dtype=float), raw).any()


def test_prior_is_the_median_of_the_clients_artifacts_with_ema(cancer):
    algo = _algo(cancer, rounds=1, ema=0.6)
    out, transcript = run_in_process(algo, cancer.clients, transcript=True)
    arts = [SparseArtifact.from_payload(r) for _, r in sorted(transcript.replies[0].items())]
    present = np.array([a.present for a in arts])
    dense = np.stack([a.dense() for a in arts])
    expected = np.empty((2, 10))
    for c in range(2):
        m = np.median(dense[present[:, c], c], axis=0)
        expected[c] = m / m.sum()
    expected = 0.6 * np.full((2, 10), 0.1) + 0.4 * expected
    np.testing.assert_allclose(out["prior"], expected / expected.sum(1, keepdims=True), atol=1e-12)


def test_a_dropped_client_is_left_out_of_both_aggregates(cancer):
    """The algorithm aggregates whichever replies arrive (the harness or Flower decides who dropped)."""
    algo = _algo(cancer, rounds=1)
    state = algo.initial_state([0, 1, 2, 3])
    msgs = algo.configure(1, state, [0, 1, 2, 3])
    replies = {cid: algo.client_step(cancer.clients[cid], msgs[cid], {}, 1)[0] for cid in range(4)}
    partial = algo.aggregate(1, state, {cid: replies[cid] for cid in (0, 2, 3)})
    n = {cid: replies[cid]["num_examples"] for cid in (0, 2, 3)}
    expected = sum(replies[c]["param/0.bias"] * (n[c] / sum(n.values())) for c in (0, 2, 3))
    np.testing.assert_allclose(partial["params"]["0.bias"], expected, atol=1e-6)
    assert partial["bytes"][-1]["clients"] == 3
    with pytest.raises(ValueError, match="no client answered"):
        algo.aggregate(1, state, {})


def test_poisoning_median_resists_where_the_mean_yields():
    task = load_task("digits", "iid", n_clients=6, seed=0)
    clients = [dataclasses.replace(c, attacker=0 if c.cid < 2 else None) for c in task.clients]
    spec = ModelSpec(64, 10, 16)
    out = {}
    for agg in ("median", "mean"):
        res = run_in_process(PoisonedXFedAlign(spec, task.groups, topk=8, rounds=2, lr=0.1, aggregation=agg),
                             clients)
        out[agg] = (np.argsort(-res["prior"], axis=1)[:, :3] == 0).any(axis=1).mean()
    # the mean hands every class to the trigger; the median only moves within the honest clients' values
    assert out["mean"] == 1.0 and out["median"] < out["mean"]


def test_baselines_run_on_the_same_clients(cancer):
    spec = ModelSpec(30, 2, 8)
    attr = run_in_process(FedAttrAgg(spec, cancer.groups, cancer.baseline, rounds=2, lr=0.05, n_steps=4),
                          cancer.clients)
    assert attr["prior"].shape == (2, 10) and attr["bytes"][-1]["explain_up"] == 4 * 2 * 10 + 2 * 2
    lin = run_in_process(FedXAI(ModelSpec(30, 2, 0), rounds=2, l1=2e-3), cancer.clients)
    assert sorted(lin["params"]) == ["0.bias", "0.weight"]
    with pytest.raises(ValueError, match="linear"):
        FedXAI(spec)


def test_bad_input_is_named(cancer):
    spec = ModelSpec(30, 2, 8)
    with pytest.raises(ValueError, match="topk must be in \\[1, 10\\]"):
        XFedAlign(spec, cancer.groups, topk=11)
    with pytest.raises(ValueError, match="noise_sigma"):
        XFedAlign(spec, cancer.groups, noise_sigma=-1.0)
    with pytest.raises(ValueError, match="mismatched feature spaces"):
        XFedAlign(spec, patch_groups())                                  # 64-pixel groups for 30 features
    with pytest.raises(ValueError, match="aggregation"):
        XFedAlign(spec, cancer.groups, aggregation="krum")
    with pytest.raises(ValueError, match="beta"):
        XFedAlign(spec, cancer.groups, beta=2.0)
    with pytest.raises(TypeError, match="ModelSpec"):
        XFedAlign((30, 2), cancer.groups)
    narrow = dataclasses.replace(cancer.clients[0], X_train=cancer.clients[0].X_train[:, :29])
    with pytest.raises(ValueError, match="mismatched feature spaces"):
        run_in_process(_algo(cancer), [narrow, *cancer.clients[1:]])
    broken = dataclasses.replace(cancer.clients[0], X_train=np.full_like(cancer.clients[0].X_train, np.nan))
    with pytest.raises(ValueError, match="NaN or Inf"):
        run_in_process(_algo(cancer), [broken])
    algo = _algo(cancer)
    state = algo.initial_state([0])
    reply = algo.client_step(cancer.clients[0], algo.configure(1, state, [0])[0], {}, 1)[0]
    reply["art_groups"] = 9                                              # an artifact of another group space
    with pytest.raises(ValueError, match="mismatched feature spaces"):
        algo.aggregate(1, state, {0: reply})
    # a class no client holds is no error: its presence bits are off everywhere, so it takes every row
    # (test_presence_bits_choose_the_rows_and_a_class_nobody_reports_takes_every_row)


def test_the_artifact_explains_the_clients_updated_model_not_the_global_one(cancer):
    algo = _algo(cancer, rounds=1)
    ids = [c.cid for c in cancer.clients]
    state = algo.initial_state(ids)
    message = algo.configure(0, state, ids)[ids[0]]
    reply, _ = algo.client_step(cancer.clients[0], dict(message), {}, 0)
    updated = params_of(reply)
    expected = algo.explain(cancer.clients[0], updated, dict(message), 0)
    stale = algo.explain(cancer.clients[0], state["params"], dict(message), 0)
    art = {k: v for k, v in reply.items() if k.startswith("art_")}
    assert set(art) == set(expected)
    for k in expected:
        np.testing.assert_array_equal(np.asarray(art[k]), np.asarray(expected[k]))
    assert any(not np.array_equal(np.asarray(expected[k]), np.asarray(stale[k])) for k in expected)


def test_presence_bits_choose_the_rows_and_a_class_nobody_reports_takes_every_row(cancer):
    """The server reads only the noised bits: a client whose bit for a class is off is left out of that class's
    median, and a class whose bit is off at every client takes every client's row (never an error)."""
    algo = _algo(cancer, rounds=1, ema=0.0)
    rng = np.random.default_rng(3)
    maps = [rng.random((2, 10)) for _ in range(3)]
    bits = [[True, False], [False, False], [True, False]]
    replies = [make_artifact(m, 4, noise_sigma=0.0, counts=np.array(b, dtype=int)).to_payload()
               for m, b in zip(maps, bits, strict=True)]
    prior = algo.aggregate_explanations(0, algo.initial_state([0, 1, 2]), replies)["prior"]
    dense = np.stack([SparseArtifact.from_payload(r).dense() for r in replies])
    med0 = np.median(dense[[0, 2], 0], axis=0)          # class 0: clients 0 and 2 only
    med1 = np.median(dense[:, 1], axis=0)               # class 1: nobody reports it -> every client
    np.testing.assert_allclose(prior, np.stack([med0 / med0.sum(), med1 / med1.sum()]), atol=1e-12)
