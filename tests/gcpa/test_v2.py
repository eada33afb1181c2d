"""v2: the scale-free GCPA ridge, the default CCA form, adding a model after fit, the tabular model set."""

from __future__ import annotations

import numpy as np
import pytest

from icml26.gcpa import GCPA, GeneralizedProcrustes, MultiviewCCA, NoAlignment, any_to_any_retrieval
from icml26.gcpa.core import relative_gamma, residual_covariance, residual_whitening
from icml26.gcpa.reference import gcpa_correction_reference, gpa_reference


def latent_views(n=300, widths=(6, 8, 7, 5), noise=0.3, seed=0):
    rng = np.random.default_rng(seed)
    Z = rng.normal(size=(n, 4))
    return [Z @ rng.normal(size=(4, d)) + noise * rng.normal(size=(n, d)) for d in widths]


@pytest.mark.parametrize("c, relative", [(1.0, True), (0.1, True), (1e-3, False)])
def test_gcpa_matches_the_float64_reference(c, relative):
    views = latent_views()
    model = GCPA(
        n_components=4, reg=c, reg_scale="relative" if relative else "absolute", tol=1e-14, max_iter=2000
    ).fit(views)
    P = [model.preprocess(X, m) for m, X in enumerate(views)]
    rotations, U = gpa_reference(P, n_iter=2000)
    W = gcpa_correction_reference(P, rotations, U, c, relative=relative)
    np.testing.assert_allclose(model.correction_, W, atol=1e-7)
    for m in range(len(views)):  # GPA is defined up to one common rotation: compare what it is invariant to
        np.testing.assert_allclose(
            model.rotations_[m] @ model.rotations_[0].T, rotations[m] @ rotations[0].T, atol=1e-7
        )


def test_relative_gamma_is_c_times_the_mean_residual_eigenvalue():
    S = np.diag([4.0, 1.0, 0.5, 0.5])
    assert relative_gamma(S, 1.0) == pytest.approx(1.5)
    assert relative_gamma(S, 0.2) == pytest.approx(0.3)


def test_scale_free_correction_does_not_depend_on_the_views_scale():
    views = latent_views()
    a = GCPA(n_components=4).fit(views)
    b = GCPA(n_components=4).fit([37.0 * X for X in views])
    np.testing.assert_allclose(a.correction_, b.correction_, rtol=1e-10)
    # the residual covariance is computed after unit-RMS preprocessing, so a global scale never reaches it; a
    # scale that reaches Sigma_w (here: by hand) rescales W by one factor with the relative ridge ...
    aligned = [a.preprocess(X, m) @ R for m, (X, R) in enumerate(zip(views, a.rotations_, strict=True))]
    W1, g1 = residual_whitening(aligned, a.universe_, 1.0)
    W2, g2 = residual_whitening([5.0 * Z for Z in aligned], 5.0 * a.universe_, 1.0)
    assert g2 == pytest.approx(25.0 * g1)
    np.testing.assert_allclose(W2 * 5.0, W1, rtol=1e-10)
    # ... and changes its shape with the absolute ridge (the first version's scale dependence)
    V1, _ = residual_whitening(aligned, a.universe_, 1e-3, relative=False)
    V2, _ = residual_whitening([5.0 * Z for Z in aligned], 5.0 * a.universe_, 1e-3, relative=False)
    assert not np.allclose(V2 * 5.0, V1, rtol=1e-3)


@pytest.mark.parametrize("c", [0.1, 1.0, 10.0])
def test_relative_ridge_bounds_the_boost_of_near_null_residual_directions(c):
    # Sigma_w with thirteen near-null noise directions, as the audit measured on digits
    lam = np.concatenate([np.full(11, 1e-2), np.full(13, 1e-6)])
    Q, _ = np.linalg.qr(np.random.default_rng(0).normal(size=(24, 24)))
    sigma = (Q * lam) @ Q.T
    gamma = relative_gamma(sigma, c)
    gains = (lam + gamma) ** -0.5
    mean_gain = (lam.mean() + gamma) ** -0.5
    # (lambda_i + c lambda_bar)^(-1/2) / (lambda_bar + c lambda_bar)^(-1/2) <= sqrt((1 + c) / c)
    assert gains.max() / mean_gain <= np.sqrt((1 + c) / c) + 1e-12
    assert gains.max() / mean_gain == pytest.approx(np.sqrt((1 + c) / c), rel=1e-2)  # attained as lambda -> 0


def test_residual_covariance_by_hand():
    U = np.array([[1.0, 0.0], [0.0, 1.0]])
    aligned = [U + np.array([[1.0, 0.0], [0.0, 0.0]]), U - np.array([[1.0, 0.0], [0.0, 0.0]])]
    np.testing.assert_allclose(residual_covariance(aligned, U), [[0.5, 0.0], [0.0, 0.0]])


def test_gcpa_interpolates_between_whitening_and_gpa():
    views = latent_views()
    gpa = GeneralizedProcrustes(n_components=4).fit(views)
    weak = GCPA(n_components=4, reg=1e6).fit(views)
    W = weak.correction_ / weak.correction_[0, 0]
    np.testing.assert_allclose(W, np.eye(4), atol=1e-5)  # c -> infinity: W ~ a multiple of I, GPA's geometry
    ret = [any_to_any_retrieval(m, views)["recall@1"] for m in (gpa, weak)]
    assert ret[0] == pytest.approx(ret[1])


def test_default_cca_form_is_maxvar():
    assert MultiviewCCA().method == "maxvar"
    assert MultiviewCCA(method="sumcor").method == "sumcor"


@pytest.mark.parametrize("method", ["maxvar", "sumcor"])
def test_cca_add_view_regresses_onto_the_frozen_consensus(method):
    views = latent_views()
    model = MultiviewCCA(n_components=4, reg=0.1, method=method).fit(views[:3])
    before = [W.copy() for W in model.weights_]
    j = model.add_view(views[3])
    assert j == 3 and model.n_views_ == 4 and model.n_maps_ == 4
    for W, W0 in zip(model.weights_[:3], before, strict=True):
        np.testing.assert_array_equal(W, W0)  # nothing refitted
    # the new model retrieves the others' items: far above chance (1 / 300)
    assert any_to_any_retrieval(model, views)["recall@1"] > 0.2
    if method == "maxvar":  # a copy of view 0 gets exactly view 0's weights (W_m is the same regression of G)
        k = model.add_view(views[0])
        np.testing.assert_allclose(
            model.transform(views[0], view=k), model.transform(views[0], view=0), atol=1e-8
        )


def test_gcpa_add_view_keeps_the_correction_and_matches_refit_on_a_copy():
    views = latent_views(noise=0.05)
    model = GCPA(n_components=4, tol=1e-14, max_iter=2000).fit(views[:3])  # converged: U is a fixed point
    W = model.correction_.copy()
    j = model.add_view(views[0])
    np.testing.assert_array_equal(model.correction_, W)
    np.testing.assert_allclose(
        model.transform(views[0], view=j), model.transform(views[0], view=0), atol=1e-5
    )


def test_no_alignment_baseline():
    views = latent_views()
    model = NoAlignment(n_components=4).fit(views)
    assert model.n_maps_ == 0
    np.testing.assert_allclose(model.transform(views[1], view=1), model.preprocess(views[1], 1))


@pytest.mark.parametrize(
    "bad, err",
    [
        (dict(reg=0.0), "reg must be"),
        (dict(reg=-1.0), "reg must be"),
        (dict(reg=float("nan")), "reg must be"),
        (dict(reg=float("inf")), "reg must be"),
        (dict(reg=True), "reg must be"),
        (dict(reg_scale="log"), "reg_scale must be"),
    ],
)
def test_bad_gcpa_settings(bad, err):
    with pytest.raises(ValueError, match=err):
        GCPA(n_components=3, **bad).fit(latent_views())


def test_transform_rejects_nan_and_inf_naming_the_view():
    model = GCPA(n_components=4).fit(latent_views())
    X = np.zeros((3, 8))
    X[1, 2] = np.inf
    with pytest.raises(ValueError, match="view 1"):
        model.transform(X, view=1)
    with pytest.raises(ValueError, match="NaN"):
        model.transform([[np.nan] * 6], view=0)


def test_tabular_views_are_paired_and_fitted_on_train_only():
    from icml26.gcpa.data import tabular_views

    d = tabular_views(seed=0, max_iter=50)
    assert len(d.train) == len(d.test) == len(d.model_names) == 6
    assert {X.shape[0] for X in d.train} == {d.y_train.shape[0]} and {X.shape[0] for X in d.test} == {171}
    assert all(np.isfinite(X).all() for X in d.train + d.test)
    again = tabular_views(seed=0, max_iter=50)
    for a, b in zip(d.test, again.test, strict=True):
        np.testing.assert_array_equal(a, b)
