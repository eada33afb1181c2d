"""Task models, Captum attributions and the shared metrics against hand values, autograd and Flower's FedAvg."""

from __future__ import annotations

import numpy as np
import pytest

from icml26.xfedalign import reference
from icml26.xfedalign.baselines import class_mean_maps
from icml26.xfedalign.data import GroupSpec, cancer_groups, load_task, patch_groups
from icml26.xfedalign.explain import group_attributions, published_explanations
from icml26.xfedalign.metrics import (
    advantage,
    auc_interval,
    deletion_insertion,
    drift_units,
    explanation_drift_index,
    greedy_oracle,
    membership_attack,
)
from icml26.xfedalign.models import (
    ModelSpec,
    fedavg,
    get_params,
    local_sgd,
    local_sgd_autograd,
    predict_logits,
    task_model,
)


@pytest.mark.parametrize("hidden,l1", [(16, 0.0), (0, 1e-3)])
def test_local_sgd_is_torch_sgd_through_autograd(hidden, l1):
    spec = ModelSpec(12, 4, hidden)
    params = get_params(task_model(12, 4, hidden=hidden, seed=1))
    rng = np.random.default_rng(0)
    X, y = rng.normal(size=(37, 12)).astype(np.float32), rng.integers(0, 4, 37)
    ours = local_sgd(params, X, y, spec=spec, lr=0.1, epochs=2, batch_size=8, l1=l1, seed=5)
    torch_ = local_sgd_autograd(params, X, y, spec=spec, lr=0.1, epochs=2, batch_size=8, l1=l1, seed=5)
    for k in ours:
        np.testing.assert_allclose(ours[k], torch_[k], atol=1e-6)


def test_fedavg_is_flowers_aggregation_bit_for_bit():
    flwr_app = pytest.importorskip("flwr.app")
    from flwr.serverapp.strategy.strategy_utils import aggregate_arrayrecords

    rng = np.random.default_rng(1)
    clients = [{"w": rng.normal(size=(3, 4)).astype(np.float32), "b": rng.normal(size=3).astype(np.float32)}
               for _ in range(5)]
    n = [17, 3, 40, 8, 11]
    ours = fedavg(clients, n)
    records = [flwr_app.RecordDict({"a": flwr_app.ArrayRecord({k: flwr_app.Array(v) for k, v in c.items()}),
                                    "m": flwr_app.MetricRecord({"num-examples": k})}) for c, k in zip(clients, n, strict=True)]
    theirs = aggregate_arrayrecords(records, "num-examples")
    for k in ours:
        np.testing.assert_array_equal(ours[k], theirs[k].numpy())
    np.testing.assert_allclose(ours["b"], sum(c["b"] * k for c, k in zip(clients, n, strict=True)) / sum(n), atol=1e-6)


def test_predict_logits_is_the_torch_module():
    import torch

    model = task_model(8, 3, hidden=5, seed=2)
    X = np.random.default_rng(2).normal(size=(6, 8)).astype(np.float32)
    with torch.no_grad():
        expected = model(torch.from_numpy(X)).numpy()
    np.testing.assert_allclose(predict_logits(ModelSpec(8, 3, 5), get_params(model), X), expected, atol=1e-6)


def test_integrated_gradients_are_exact_on_a_linear_model_and_complete_on_an_mlp():
    groups = patch_groups(4, 4, 2)
    rng = np.random.default_rng(3)
    X, base = rng.random((5, 16)).astype(np.float32), rng.random(16).astype(np.float32)
    lin = ModelSpec(16, 3, 0)
    params = get_params(task_model(16, 3, hidden=0, seed=3))
    A, yhat = group_attributions(lin, params, X, base, groups, n_steps=8)
    W = params["0.weight"].astype(np.float64)
    exact = groups.pool(W[yhat] * (X - base))                      # IG of a linear model: W_c (x - x')
    np.testing.assert_allclose(A, exact, atol=1e-5)
    occ, _ = group_attributions(lin, params, X, base, groups, method="occlusion")
    np.testing.assert_allclose(occ, exact, atol=1e-5)              # occluding a group removes exactly its term
    ixg, _ = group_attributions(lin, params, X, base, groups, method="input_x_gradient")
    np.testing.assert_allclose(ixg, groups.pool(W[yhat] * X), atol=1e-5)   # Captum's x * grad (no baseline)
    mlp = ModelSpec(16, 3, 12)
    mparams = get_params(task_model(16, 3, hidden=12, seed=4))
    A, yhat = group_attributions(mlp, mparams, X, base, groups, n_steps=64)
    f = predict_logits(mlp, mparams, X)[np.arange(5), yhat] - predict_logits(mlp, mparams, base[None])[0, yhat]
    np.testing.assert_allclose(A.sum(1), f, atol=2e-3)             # completeness: sum_g IG_g = f(x) - f(x')


def test_published_explanation_mixes_the_predicted_class_row():
    local = np.array([[0.0, 1.0, 3.0]])
    prior = np.array([[1.0, 0.0, 0.0], [0.0, 0.0, 1.0]])
    out = published_explanations(local, np.array([0]), prior, 0.5)
    np.testing.assert_allclose(out, [[0.5, 0.125, 0.375]])
    np.testing.assert_allclose(published_explanations(local, np.array([0]), None, 0.5), [[0.0, 0.25, 0.75]])


def _toy():
    groups = GroupSpec(((0,), (1, 2)), 3)

    def proba(X):
        X = np.asarray(X, dtype=float).reshape(-1, 3)
        z = 2.0 * X[:, 0] + 0.5 * (X[:, 1] + X[:, 2])
        p1 = 1 / (1 + np.exp(-z))
        return np.stack([1 - p1, p1], 1)

    return groups, proba


def test_deletion_insertion_against_the_step_by_step_reference():
    groups, proba = _toy()
    rng = np.random.default_rng(4)
    X, scores, base = rng.random((6, 3)), rng.random((6, 2)), rng.random(3)
    scores[0] = [0.5, 0.5]                                          # a tie: group 0 goes first
    dl, il = deletion_insertion(proba, X, scores, groups, base, target=np.ones(6, dtype=int))
    for i in range(6):
        ref = reference.deletion_insertion_reference(lambda x: proba(x)[0].tolist(), X[i], scores[i],
                                                     groups.groups, base, 1)
        assert dl[i] == pytest.approx(ref[0], abs=1e-12) and il[i] == pytest.approx(ref[1], abs=1e-12)


def test_deletion_insertion_hand_value_and_oracle():
    groups, proba = _toy()
    x, base = np.array([[1.0, 1.0, 1.0]]), np.zeros(3)
    p = lambda v: proba(np.array(v))[0, 1]                         # noqa: E731
    # deleting group 0 first: fractions 0, 1/3, 1; p(x), p(x without f0), p(base)
    expected = (1 / 3) * (p([1, 1, 1]) + p([0, 1, 1])) / 2 + (2 / 3) * (p([0, 1, 1]) + p([0, 0, 0])) / 2
    dl, _ = deletion_insertion(proba, x, np.array([[1.0, 0.0]]), groups, base, np.array([1]))
    assert dl[0] == pytest.approx(expected, abs=1e-12)
    od, oi = greedy_oracle(proba, x, groups, base, np.array([1]))
    best_del = min(deletion_insertion(proba, x, s, groups, base, np.array([1]))[0][0]
                   for s in (np.array([[1.0, 0.0]]), np.array([[0.0, 1.0]])))
    assert deletion_insertion(proba, x, od, groups, base, np.array([1]))[0][0] == pytest.approx(best_del)
    best_ins = max(deletion_insertion(proba, x, s, groups, base, np.array([1]))[1][0]
                   for s in (np.array([[1.0, 0.0]]), np.array([[0.0, 1.0]])))
    assert deletion_insertion(proba, x, oi, groups, base, np.array([1]))[1][0] == pytest.approx(best_ins)


def test_drift_units_hand_value_and_pairing():
    a = np.array([[1.0, 0.0], [1.0, 0.0]])
    b = np.array([[0.0, 1.0], [0.0, 1.0]])
    values, keys = drift_units([a, b], [np.array([0, 0]), np.array([0, 0])], 2)
    assert keys == [(0, 0), (1, 0)]
    # each client's map against the reference r = (0.5, 0.5): JSD = H(m) - (H(p) + H(r)) / 2, m = (0.75, 0.25)
    h = -(0.75 * np.log2(0.75) + 0.25 * np.log2(0.25))
    np.testing.assert_allclose(values, [h - 0.5, h - 0.5], atol=1e-12)
    assert explanation_drift_index([a, a], [np.array([0, 0])] * 2, 2) == 0.0
    # a class with a single item in a client gives no unit
    _, keys = drift_units([a, b], [np.array([0, 1]), np.array([0, 0])], 2)
    assert keys == [(1, 0)]


def test_membership_attack():
    rng = np.random.default_rng(5)
    members = np.arange(80) % 2 == 1
    feats = rng.normal(size=(80, 3)) + 4.0 * members[:, None]
    correct = membership_attack(feats[:40], members[:40], feats[40:], members[40:])
    assert advantage(correct) == 1.0
    flat = membership_attack(np.zeros((40, 1)), members[:40], np.zeros((40, 1)), members[40:])
    assert advantage(flat) == 0.0
    weak = rng.normal(size=(80, 2)) + 0.8 * members[:, None]
    correct, scores = membership_attack(weak[:40], members[:40], weak[40:], members[40:], return_scores=True)
    np.testing.assert_array_equal(correct, membership_attack(weak[:40], members[:40], weak[40:], members[40:]))
    np.testing.assert_array_equal(correct, ((scores > 0.5) == members[40:]).astype(float))


def test_auc_interval_is_sklearns_auc_with_the_hanley_mcneil_interval():
    """Oracles: sklearn's roc_auc_score for the point (ties count half), and Hanley & McNeil's SE by hand."""
    from sklearn.metrics import roc_auc_score

    rng = np.random.default_rng(2)
    members = np.arange(50) % 3 == 0
    scores = np.round(rng.normal(size=50) + 0.7 * members, 1)          # rounded: ties between the two classes
    auc, lo, hi = auc_interval(scores, members)
    assert auc == pytest.approx(roc_auc_score(members, scores), abs=1e-12)
    n1, n0 = members.sum(), (~members).sum()
    q1, q2 = auc / (2 - auc), 2 * auc**2 / (1 + auc)
    se = np.sqrt((auc * (1 - auc) + (n1 - 1) * (q1 - auc**2) + (n0 - 1) * (q2 - auc**2)) / (n1 * n0))
    assert (lo, hi) == pytest.approx((auc - 1.959964 * se, auc + 1.959964 * se), abs=1e-6)
    # hand case: 2 members, 2 non-members, one discordant pair -> 3/4
    assert auc_interval(np.array([0.9, 0.2, 0.5, 0.1]), np.array([1, 1, 0, 0]))[0] == 0.75
    with pytest.raises(ValueError, match="both"):
        auc_interval(np.array([0.1, 0.2]), np.array([1, 1]))
    with pytest.raises(ValueError, match="scores"):
        auc_interval(np.array([np.nan, 0.2]), np.array([1, 0]))


def test_data_worlds_and_bad_input():
    task = load_task("cancer", "dirichlet", n_clients=4, seed=1)
    assert task.n_groups == 10 and task.groups.names[0] == "radius"
    assert sum(len(c.y_train) + len(c.y_val) + len(c.y_test) for c in task.clients) == 569
    assert cancer_groups().groups[0] == (0, 10, 20)
    digits = load_task("digits", "dirichlet", n_clients=4, seed=0)
    erased = [j for j in range(64) if np.ptp(digits.clients[1].X_train[:, j]) == 0]
    assert set(range(16, 24)) <= set(erased)                        # client 1: pixel rows 2-3 erased
    with pytest.raises(ValueError, match="name must be"):
        load_task("mnist")
    with pytest.raises(ValueError, match="partition"):
        load_task("digits", "pathological")
    with pytest.raises(ValueError, match="partition the 3 features"):
        GroupSpec(((0,), (0, 1)), 3)
    with pytest.raises(ValueError, match="no samples of class 2"):
        class_mean_maps(np.ones((2, 3)), np.array([0, 1]), 3, require_all=True)
    with pytest.raises(ValueError, match="scores must be"):
        deletion_insertion(lambda X: np.ones((len(X), 2)) / 2, np.ones((2, 3)), np.ones((2, 3)),
                           GroupSpec(((0,), (1, 2)), 3), np.zeros(3))
    with pytest.raises(ValueError, match="X must be"):
        group_attributions(ModelSpec(16, 2, 0), get_params(task_model(16, 2, hidden=0)), np.ones((2, 15)),
                           np.zeros(16), patch_groups(4, 4, 2))
