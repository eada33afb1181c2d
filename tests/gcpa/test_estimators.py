"""GPA / multi-view CCA / GCPA against independent oracles (scipy, sklearn, closed forms), invariances, bad input."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.linalg
from sklearn.cross_decomposition import CCA

from icml26.gcpa import (
    GCPA,
    GeneralizedProcrustes,
    MultiviewCCA,
    PairwiseCCA,
    PairwiseProcrustes,
    any_to_any_retrieval,
)
from icml26.gcpa.core import ViewPreprocessor, generalized_procrustes, mcca_sumcor


def latent_views(n=300, widths=(6, 8, 7, 5), noise=0.3, seed=0):
    rng = np.random.default_rng(seed)
    Z = rng.normal(size=(n, 4))
    return [Z @ rng.normal(size=(4, d)) + noise * rng.normal(size=(n, d)) for d in widths]


def test_two_view_gpa_is_orthogonal_procrustes():
    rng = np.random.default_rng(1)
    A, B = rng.normal(size=(50, 5)), rng.normal(size=(50, 5))
    rotations, _, _ = generalized_procrustes([A, B], tol=1e-14, max_iter=1000)
    R_scipy, _ = scipy.linalg.orthogonal_procrustes(A, B)
    np.testing.assert_allclose(rotations[0] @ rotations[1].T, R_scipy, atol=1e-8)


def test_rotations_are_orthogonal_and_preserve_norms():
    views = latent_views()
    model = GeneralizedProcrustes(n_components=4).fit(views)
    for i, (R, X) in enumerate(zip(model.rotations_, views, strict=True)):
        np.testing.assert_allclose(R.T @ R, np.eye(4), atol=1e-12)
        P = model.preprocess(X, i)
        np.testing.assert_allclose(
            np.linalg.norm(model.transform(X, view=i), axis=1), np.linalg.norm(P, axis=1), rtol=1e-12
        )
    assert model.n_iter_ < model.max_iter


@pytest.mark.parametrize("method", ["sumcor", "maxvar"])
def test_two_view_cca_matches_sklearn_and_the_closed_form(method):
    rng = np.random.default_rng(0)
    n = 400
    z = rng.normal(size=(n, 2))
    X = np.hstack([z, rng.normal(size=(n, 3))]) @ rng.normal(size=(5, 5))
    Y = np.hstack([z + 0.5 * rng.normal(size=(n, 2)), rng.normal(size=(n, 2))]) @ rng.normal(size=(4, 4))
    model = MultiviewCCA(n_components=4, reg=0.0, method=method).fit([X, Y])
    Zx, Zy = model.transform(X, view=0), model.transform(Y, view=1)
    ours = [np.corrcoef(Zx[:, j], Zy[:, j])[0, 1] for j in range(3)]
    # closed form: singular values of Cxx^(-1/2) Cxy Cyy^(-1/2) (PCA to 4 dims keeps Y whole and X's span)
    Px, Py = model.preprocess(X, 0), model.preprocess(Y, 1)
    Cxx, Cyy, Cxy = Px.T @ Px, Py.T @ Py, Px.T @ Py
    isq = lambda C: scipy.linalg.fractional_matrix_power(C, -0.5).real  # noqa: E731
    rho = np.linalg.svd(isq(Cxx) @ Cxy @ isq(Cyy), compute_uv=False)[:3]
    np.testing.assert_allclose(ours, rho, atol=1e-8)
    cca = CCA(n_components=3, scale=False, max_iter=5000, tol=1e-12).fit(Px, Py)
    sx, sy = cca.transform(Px, Py)
    np.testing.assert_allclose(ours, [np.corrcoef(sx[:, j], sy[:, j])[0, 1] for j in range(3)], atol=1e-6)


def test_sumcor_eigenvalues_are_one_plus_canonical_correlations():
    rng = np.random.default_rng(2)
    X, Y = rng.normal(size=(200, 3)), rng.normal(size=(200, 3))
    X, Y = X - X.mean(0), Y - Y.mean(0)
    _, lam = mcca_sumcor([X, Y], 3, 0.0)
    Cxx, Cyy, Cxy = X.T @ X, Y.T @ Y, X.T @ Y
    isq = lambda C: scipy.linalg.fractional_matrix_power(C, -0.5).real  # noqa: E731
    np.testing.assert_allclose(
        lam - 1, np.linalg.svd(isq(Cxx) @ Cxy @ isq(Cyy), compute_uv=False), atol=1e-10
    )


@pytest.mark.parametrize(
    "make",
    [
        lambda: GeneralizedProcrustes(4),
        lambda: GCPA(4),
        lambda: MultiviewCCA(4),
        lambda: PairwiseProcrustes(4),
        lambda: PairwiseCCA(4),
    ],
)
def test_retrieval_is_invariant_to_rotating_an_input_view(make):
    views = latent_views()
    test = latent_views(seed=0)  # same latent; evaluate on the anchors themselves
    base = any_to_any_retrieval(make().fit(views), test)
    Q, _ = np.linalg.qr(np.random.default_rng(5).normal(size=(8, 8)))
    rotated = [views[0], views[1] @ Q, views[2], views[3]]
    rot = any_to_any_retrieval(make().fit(rotated), [test[0], test[1] @ Q, test[2], test[3]])
    for key in base:
        assert rot[key] == pytest.approx(base[key], abs=1e-9)


def test_gcpa_uses_one_shared_correction_and_needs_m_maps():
    views = latent_views()
    gcpa = GCPA(n_components=4, reg=1e-2).fit(views)
    gpa = GeneralizedProcrustes(n_components=4).fit(views)
    for i, X in enumerate(views):
        np.testing.assert_allclose(
            gcpa.transform(X, view=i), gpa.transform(X, view=i) @ gcpa.correction_, atol=1e-10
        )
    np.testing.assert_allclose(gcpa.correction_, gcpa.correction_.T, atol=1e-12)
    assert (
        gcpa.n_maps_ == 4
        and PairwiseProcrustes(4).fit(views).n_maps_ == 12
        and PairwiseCCA(4).fit(views).n_maps_ == 6
    )


def test_add_view_recovers_a_rotated_copy():
    views = latent_views(noise=0.05)
    model = GeneralizedProcrustes(n_components=4).fit(views[:3])
    Q, _ = np.linalg.qr(np.random.default_rng(3).normal(size=(6, 6)))
    j = model.add_view(views[0] @ Q)
    assert j == 3 and model.n_views_ == 4
    # equal up to GPA's convergence tolerance (the new view is fitted to the final U, view 0 to the one before)
    np.testing.assert_allclose(
        model.transform(views[0] @ Q, view=3), model.transform(views[0], view=0), atol=1e-5
    )


def test_translate_between_isometric_models_is_exact():
    rng = np.random.default_rng(4)
    Z = rng.normal(size=(100, 4))
    views = [Z @ np.linalg.qr(rng.normal(size=(d, d)))[0][:4] for d in (5, 6, 7)]  # isometric embeddings
    model = GeneralizedProcrustes(n_components=4).fit(views)
    np.testing.assert_allclose(model.translate(views[0], 0, 2), model.preprocess(views[2], 2), atol=1e-8)


def test_preprocessor_uses_train_statistics_only():
    X = np.random.default_rng(0).normal(size=(50, 6)) + 3.0
    pre = ViewPreprocessor.fit(X, 3)
    P = pre.transform(X)
    np.testing.assert_allclose(P.mean(0), 0, atol=1e-12)
    assert np.sqrt(np.mean(np.sum(P**2, axis=1))) == pytest.approx(1.0)
    np.testing.assert_allclose(
        pre.transform(X + 1.0), P + (np.ones(6) @ pre.components_) / pre.scale_, atol=1e-12
    )


@pytest.mark.parametrize(
    "Xs, err, match",
    [
        (np.zeros((5, 3)), TypeError, "list of 2-D arrays"),
        ([np.zeros((5, 3))], ValueError, "at least 2 views"),
        ([np.ones((5, 3)), np.ones((6, 3))], ValueError, "same number of rows"),
        ([np.ones((5, 3)), np.full((5, 3), np.nan)], ValueError, "view 1"),
        ([np.ones((5, 3)), np.ones(5)], ValueError, "view 1"),
    ],
)
def test_bad_views(Xs, err, match):
    with pytest.raises(err, match=match):
        GeneralizedProcrustes().fit(Xs)


def test_width_smaller_than_requested_dimension():
    with pytest.raises(ValueError, match=r"n_components=5 exceeds the width of view\(s\) \[1\]"):
        rng = np.random.default_rng(0)
        GCPA(n_components=5).fit([rng.random((20, 6)), rng.random((20, 4))])
    with pytest.raises(ValueError, match="n_components must be"):
        MultiviewCCA(n_components=0).fit(latent_views())


def test_unknown_view_and_wrong_width_in_transform():
    model = MultiviewCCA(n_components=4).fit(latent_views())
    with pytest.raises(ValueError, match="unknown view 7"):
        model.transform(np.zeros((2, 6)), view=7)
    with pytest.raises(ValueError, match="view 0 has 6 features"):
        model.transform(np.zeros((2, 5)), view=0)
    with pytest.raises(TypeError, match="view must be an int"):
        model.transform(np.zeros((2, 6)), view="0")


@pytest.mark.parametrize("bad", [dict(reg=1.0), dict(reg=-0.1), dict(method="kcca")])
def test_bad_cca_settings(bad):
    with pytest.raises(ValueError):
        MultiviewCCA(n_components=3, **bad).fit(latent_views())
