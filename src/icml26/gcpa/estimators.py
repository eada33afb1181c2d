"""Multi-view alignment estimators with the scikit-learn contract: GPA, multi-view CCA, GCPA, pairwise baselines.

``fit(Xs)`` takes a list of M >= 2 paired embedding matrices (same rows = the same anchor inputs seen by M
models; widths may differ). Every view is centred, reduced to ``n_components`` principal directions and scaled
to unit RMS row norm with statistics of the training anchors only, then:

- ``GeneralizedProcrustes``: orthogonal maps Omega_m to a shared consensus U (one map per model; a new model is
  added with one Procrustes fit to the frozen U, ``add_view``);
- ``GCPA``: the GPA universe followed by a shared correction W of directional mismatch, Z_m = X_m Omega_m W,
  with a scale-free ridge (gamma = ``reg`` tr(Sigma_w) / k);
- ``MultiviewCCA``: generalised CCA (MAXVAR, default) or SUMCOR multi-view CCA, with ridge shrinkage ``reg``;
- ``NoAlignment``: the trivial baseline, each model's preprocessed space as it is;
- ``PairwiseProcrustes`` / ``PairwiseCCA``: one map per (ordered / unordered) pair of models, the baselines that
  scale quadratically with M.

``transform(X, view=i)`` maps new rows of model i into the shared space; ``embed_pair(X_src, X_dst, src, dst)``
gives both sides of a model pair in the space where they are compared (the universe, or the pair's own space
for the pairwise baselines), which is what the metrics use.

Example:
    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> Z = rng.normal(size=(200, 5))
    >>> views = [Z @ rng.normal(size=(5, d)) + 0.01 * rng.normal(size=(200, d)) for d in (6, 8, 7)]
    >>> model = GCPA(n_components=5).fit(views)
    >>> [z.shape for z in model.fit_transform(views)]
    [(200, 5), (200, 5), (200, 5)]
    >>> model.transform(views[1][:3], view=1).shape
    (3, 5)

Reference: A. Achara et al., "Multi-Way Representation Alignment", ICML 2026, arXiv:2602.06205.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import numpy as np
from sklearn.base import BaseEstimator, TransformerMixin, clone
from sklearn.utils.validation import check_array, check_is_fitted, validate_data

from .core import (
    ViewPreprocessor,
    gcca_maxvar,
    generalized_procrustes,
    mcca_sumcor,
    orthogonal_procrustes,
    residual_whitening,
    ridge_weights,
)


def check_views(Xs: Any, *, min_views: int = 2) -> list[np.ndarray]:
    """Validate a list of paired views: >= ``min_views`` finite 2-D arrays with the same number of rows (>= 2)."""
    if isinstance(Xs, np.ndarray) or not isinstance(Xs, Sequence):
        raise TypeError(f"Xs must be a list of 2-D arrays (one per model), got {type(Xs).__name__}")
    if len(Xs) < min_views:
        raise ValueError(f"Xs must hold at least {min_views} views, got {len(Xs)}")
    views = []
    for i, X in enumerate(Xs):
        try:
            views.append(check_array(X, dtype=np.float64, ensure_all_finite=True, ensure_min_samples=2))
        except ValueError as exc:
            raise ValueError(f"view {i}: {exc}") from exc
    rows = [X.shape[0] for X in views]
    if len(set(rows)) != 1:
        raise ValueError(f"views must have the same number of rows (paired anchors), got {rows}")
    return views


class _MultiView(TransformerMixin, BaseEstimator):
    """Shared validation, preprocessing and the transform/embed_pair API."""

    def __init__(self, n_components: int | None = None):
        self.n_components = n_components

    # -- fitting helpers -------------------------------------------------------------------------------------
    def _preprocess(self, Xs: Any) -> list[np.ndarray]:
        views = check_views(Xs)
        widths = [X.shape[1] for X in views]
        k = min(widths) if self.n_components is None else self.n_components
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
            raise ValueError(f"n_components must be a positive int or None, got {self.n_components!r}")
        narrow = [i for i, w in enumerate(widths) if w < k]
        if narrow:
            raise ValueError(f"n_components={k} exceeds the width of view(s) {narrow} (widths {widths})")
        if k > views[0].shape[0]:
            raise ValueError(f"n_components={k} exceeds the number of anchors ({views[0].shape[0]})")
        self.n_components_ = int(k)
        self.n_views_ = len(views)
        self.n_features_per_view_ = widths
        self.n_anchors_ = views[0].shape[0]
        self.preprocessors_ = [ViewPreprocessor.fit(X, self.n_components_) for X in views]
        return [p.transform(X) for p, X in zip(self.preprocessors_, views, strict=True)]

    def _check_view(self, X: Any, view: Any) -> np.ndarray:
        check_is_fitted(self, "preprocessors_")
        if isinstance(view, bool) or not isinstance(view, (int, np.integer)):
            raise TypeError(f"view must be an int, got {type(view).__name__}")
        if not 0 <= view < len(self.preprocessors_):
            raise ValueError(
                f"unknown view {view}: this model was fitted on {len(self.preprocessors_)} views"
            )
        if isinstance(X, np.ndarray) and X.dtype == np.float64 and X.ndim == 2 and X.shape[0] > 0:
            if not np.isfinite(X).all():  # the fast path of check_array (called once per pair in the metrics)
                raise ValueError(f"X for view {view} contains NaN or infinity")
        else:
            X = check_array(X, dtype=np.float64, ensure_all_finite=True)
        expected = self.preprocessors_[view].mean_.shape[0]
        if X.shape[1] != expected:
            raise ValueError(f"view {view} has {expected} features, got X with {X.shape[1]}")
        return self.preprocessors_[view].transform(X)

    # -- public API ------------------------------------------------------------------------------------------
    def transform(self, X: Any, view: int = 0) -> np.ndarray:  # pragma: no cover - overridden
        raise NotImplementedError

    def transform_views(self, Xs: Sequence[Any]) -> list[np.ndarray]:
        """``[transform(X_m, view=m) for m]`` for a list of views (rows need not match the anchors)."""
        return [self.transform(X, view=i) for i, X in enumerate(Xs)]

    def fit_transform(self, Xs: Any, y: Any = None, **fit_params: Any) -> list[np.ndarray]:
        """Fit on the views and return their embeddings in the shared space."""
        return self.fit(Xs, y, **fit_params).transform_views(Xs)

    def embed_pair(self, X_src: Any, X_dst: Any, src: int, dst: int) -> tuple[np.ndarray, np.ndarray]:
        """Both sides of the model pair (src, dst) in the space where they are compared."""
        return self.transform(X_src, view=src), self.transform(X_dst, view=dst)

    def preprocess(self, X: Any, view: int) -> np.ndarray:
        """View ``view``'s rows after centring, PCA and scaling (the space geometry is measured in)."""
        return self._check_view(X, view)


class GeneralizedProcrustes(_MultiView):
    """Generalized Procrustes Analysis: an isometric universe shared by M models.

    Minimises sum_m ||X_m Omega_m - U||_F^2 over orthogonal Omega_m and the consensus U (alternating Procrustes
    fits and averaging), on views preprocessed to ``n_components`` dimensions.

    Args:
        n_components: common dimension k (default: the smallest view width).
        max_iter: maximum GPA iterations.
        tol: stop when the objective's relative decrease in an iteration falls below this.

    Attributes:
        rotations_: list of (k, k) orthogonal maps; universe_: (n_anchors, k) consensus; n_iter_: iterations.
    """

    def __init__(self, n_components: int | None = None, max_iter: int = 200, tol: float = 1e-6):
        super().__init__(n_components)
        self.max_iter = max_iter
        self.tol = tol

    def fit(self, Xs: Any, y: Any = None) -> GeneralizedProcrustes:
        if not isinstance(self.max_iter, int) or self.max_iter < 1:
            raise ValueError(f"max_iter must be a positive int, got {self.max_iter!r}")
        if not self.tol > 0:
            raise ValueError(f"tol must be > 0, got {self.tol!r}")
        P = self._preprocess(Xs)
        self.rotations_, self.universe_, self.n_iter_ = generalized_procrustes(
            P, max_iter=self.max_iter, tol=self.tol
        )
        self.n_maps_ = len(self.rotations_)
        self._after_gpa(P)
        return self

    def _after_gpa(self, P: list[np.ndarray]) -> None:
        """Hook for GCPA's correction."""

    def _output_map(self) -> np.ndarray | None:
        return None

    def transform(self, X: Any, view: int = 0) -> np.ndarray:
        """Map rows of model ``view`` into the universe."""
        Z = self._check_view(X, view) @ self.rotations_[view]
        W = self._output_map()
        return Z if W is None else Z @ W

    def translate(self, X: Any, src: int, dst: int) -> np.ndarray:
        """Rows of model ``src`` expressed in model ``dst``'s preprocessed space: X_src Omega_src Omega_dst^T."""
        self._check_view(np.zeros((1, self.n_features_per_view_[dst])), dst)
        return self._check_view(X, src) @ self.rotations_[src] @ self.rotations_[dst].T

    def add_view(self, X_new: Any) -> int:
        """Add a model with one Procrustes fit to the frozen universe; return its view index.

        ``X_new`` must embed the same training anchors, in the same order, as the views given to ``fit``.
        """
        check_is_fitted(self, "universe_")
        X = check_views([np.zeros((self.n_anchors_, 1)), X_new])[1]
        if X.shape[1] < self.n_components_:
            raise ValueError(f"the new view has width {X.shape[1]} < n_components={self.n_components_}")
        pre = ViewPreprocessor.fit(X, self.n_components_)
        # $$\Omega_{new} = \mathrm{Procrustes}(X_{new}, U)$$   (U frozen: one SVD)
        self.rotations_.append(orthogonal_procrustes(pre.transform(X), self.universe_))
        self.preprocessors_.append(pre)
        self.n_features_per_view_.append(X.shape[1])
        self.n_views_ += 1
        self.n_maps_ += 1
        return self.n_views_ - 1


class GCPA(GeneralizedProcrustes):
    """Geometry-Corrected Procrustes Alignment: a GPA universe plus a shared correction of directional mismatch.

    The correction (reconstructed; "residual whitening") whitens the pooled within-universe disagreement:
    W = (Sigma_w + gamma I)^(-1/2), Sigma_w = 1/(M N) sum_m (X_m Omega_m - U)^T (X_m Omega_m - U); every model uses
    the same W, so the universe stays one space and a new model still needs one map (``add_view`` keeps W).

    The ridge is scale-free by default: gamma = reg tr(Sigma_w) / k, ``reg`` times the mean residual eigenvalue,
    so the correction does not depend on how the views were scaled (``core.relative_gamma`` has the derivation);
    ``reg_scale="absolute"`` gives the first version's gamma = reg.

    Args:
        n_components, max_iter, tol: as in ``GeneralizedProcrustes``.
        reg: correction strength c > 0; smaller corrects more (more agreement, more distortion of each model's
            geometry), larger tends to GPA. Default 1: gamma = the mean residual eigenvalue, which caps the gain
            of any residual direction over the mean one at sqrt(2).
        reg_scale: ``"relative"`` (gamma = reg tr(Sigma_w) / k, default) or ``"absolute"`` (gamma = reg).

    Attributes:
        correction_: the (k, k) shared map W; gamma_: the ridge used; plus GPA's attributes.

    Example:
        >>> import numpy as np
        >>> rng = np.random.default_rng(0)
        >>> Z = rng.normal(size=(200, 3))
        >>> views = [Z @ rng.normal(size=(3, 5)) + 0.3 * rng.normal(size=(200, 5)) for _ in range(3)]
        >>> a = GCPA(n_components=3).fit(views)
        >>> b = GCPA(n_components=3).fit([100.0 * X for X in views])   # scale-free: the same correction
        >>> bool(np.allclose(a.correction_, b.correction_))
        True
    """

    def __init__(
        self,
        n_components: int | None = None,
        max_iter: int = 200,
        tol: float = 1e-6,
        reg: float = 1.0,
        reg_scale: str = "relative",
    ):
        super().__init__(n_components, max_iter, tol)
        self.reg = reg
        self.reg_scale = reg_scale

    def fit(self, Xs: Any, y: Any = None) -> GCPA:
        if (
            isinstance(self.reg, bool)
            or not isinstance(self.reg, (int, float, np.floating))
            or not self.reg > 0
            or not np.isfinite(self.reg)
        ):
            raise ValueError(f"reg must be a finite number > 0, got {self.reg!r}")
        if self.reg_scale not in ("relative", "absolute"):
            raise ValueError(f"reg_scale must be 'relative' or 'absolute', got {self.reg_scale!r}")
        super().fit(Xs, y)
        return self

    def _after_gpa(self, P: list[np.ndarray]) -> None:
        aligned = [X @ R for X, R in zip(P, self.rotations_, strict=True)]
        self.correction_, self.gamma_ = residual_whitening(
            aligned, self.universe_, float(self.reg), relative=self.reg_scale == "relative"
        )

    def _output_map(self) -> np.ndarray | None:
        return self.correction_


class MultiviewCCA(_MultiView):
    """Multi-view CCA: generalised CCA (MAXVAR, default) or SUMCOR, with ridge shrinkage.

    MAXVAR (Carroll 1968; Kettenring 1971) finds a shared consensus G and regresses it on each view: it is the
    CCA counterpart of GPA's universe (one map per model, a new model regressed onto the frozen G), and it is
    the stronger of the two forms on all three embedded model sets, so it is the default and the baseline the
    card compares with. SUMCOR (``method="sumcor"``, the generalised eigenproblem of cca-zoo's ``MCCA``)
    maximises the sum of pairwise correlations.

    Args:
        n_components: common preprocessing dimension and number of canonical components (default: smallest width).
        reg: shrinkage of each view's covariance towards a scaled identity, in [0, 1).
        method: ``"maxvar"`` (default) or ``"sumcor"``.

    Attributes:
        weights_: list of (k, n_components) canonical weights; eigenvalues_; consensus_: the anchors' shared
        variates (MAXVAR's G; SUMCOR: the mean of the views' variates), onto which ``add_view`` regresses.

    Example:
        >>> import numpy as np
        >>> rng = np.random.default_rng(0)
        >>> Z = rng.normal(size=(200, 3))
        >>> views = [Z @ rng.normal(size=(3, 5)) + 0.3 * rng.normal(size=(200, 5)) for _ in range(3)]
        >>> cca = MultiviewCCA(n_components=3).fit(views)
        >>> j = cca.add_view(views[0])                  # a copy of view 0 gets view 0's weights
        >>> bool(np.allclose(cca.transform(views[0], view=j), cca.transform(views[0], view=0)))
        True
    """

    def __init__(self, n_components: int | None = None, reg: float = 0.1, method: str = "maxvar"):
        super().__init__(n_components)
        self.reg = reg
        self.method = method

    def fit(self, Xs: Any, y: Any = None) -> MultiviewCCA:
        if not 0.0 <= self.reg < 1.0:
            raise ValueError(f"reg must be in [0, 1), got {self.reg!r}")
        if self.method not in ("sumcor", "maxvar"):
            raise ValueError(f"method must be 'sumcor' or 'maxvar', got {self.method!r}")
        P = self._preprocess(Xs)
        if self.method == "maxvar":
            self.weights_, self.eigenvalues_, self.consensus_ = gcca_maxvar(
                P, self.n_components_, self.reg, return_consensus=True
            )
        else:
            self.weights_, self.eigenvalues_ = mcca_sumcor(P, self.n_components_, self.reg)
            self.consensus_ = np.mean([X @ W for X, W in zip(P, self.weights_, strict=True)], axis=0)
        self.n_maps_ = len(self.weights_)
        return self

    def add_view(self, X_new: Any) -> int:
        """Add a model without refitting: regress the frozen consensus on its anchors; return its view index.

        ``X_new`` must embed the same training anchors, in the same order, as the views given to ``fit``.
        """
        check_is_fitted(self, "consensus_")
        X = check_views([np.zeros((self.n_anchors_, 1)), X_new])[1]
        if X.shape[1] < self.n_components_:
            raise ValueError(f"the new view has width {X.shape[1]} < n_components={self.n_components_}")
        pre = ViewPreprocessor.fit(X, self.n_components_)
        # $$W_{new} = A_{new} X_{new}^\top G / n$$   (G frozen: one regression)
        self.weights_.append(ridge_weights(pre.transform(X), self.consensus_, self.reg))
        self.preprocessors_.append(pre)
        self.n_features_per_view_.append(X.shape[1])
        self.n_views_ += 1
        self.n_maps_ += 1
        return self.n_views_ - 1

    def transform(self, X: Any, view: int = 0) -> np.ndarray:
        """Canonical variates of model ``view``'s rows."""
        return self._check_view(X, view) @ self.weights_[view]


class NoAlignment(_MultiView):
    """Trivial baseline: every model's rows in its own preprocessed space, compared as they are (no map)."""

    def fit(self, Xs: Any, y: Any = None) -> NoAlignment:
        self._preprocess(Xs)
        self.n_maps_ = 0
        return self

    def transform(self, X: Any, view: int = 0) -> np.ndarray:
        """Model ``view``'s rows after centring, PCA and scaling."""
        return self._check_view(X, view)


class PairwiseProcrustes(_MultiView):
    """Baseline: one orthogonal Procrustes map per ordered pair of models (M (M - 1) maps)."""

    def fit(self, Xs: Any, y: Any = None) -> PairwiseProcrustes:
        P = self._preprocess(Xs)
        self.maps_ = {
            (a, b): orthogonal_procrustes(P[a], P[b]) for a, b in itertools.permutations(range(len(P)), 2)
        }
        self.n_maps_ = len(self.maps_)
        return self

    def transform(self, X: Any, view: int = 0) -> np.ndarray:
        """Model ``view``'s rows in its own preprocessed space (there is no shared space)."""
        return self._check_view(X, view)

    def embed_pair(self, X_src: Any, X_dst: Any, src: int, dst: int) -> tuple[np.ndarray, np.ndarray]:
        """Source rows mapped into the destination model's space, and the destination rows."""
        return self._check_view(X_src, src) @ self.maps_[(src, dst)], self._check_view(X_dst, dst)


class PairwiseCCA(_MultiView):
    """Baseline: a two-view CCA per unordered pair of models (M (M - 1) / 2 fits)."""

    def __init__(self, n_components: int | None = None, reg: float = 0.1):
        super().__init__(n_components)
        self.reg = reg

    def fit(self, Xs: Any, y: Any = None) -> PairwiseCCA:
        if not 0.0 <= self.reg < 1.0:
            raise ValueError(f"reg must be in [0, 1), got {self.reg!r}")
        P = self._preprocess(Xs)
        self.weights_ = {}
        for a, b in itertools.combinations(range(len(P)), 2):
            (wa, wb), _ = mcca_sumcor([P[a], P[b]], self.n_components_, self.reg)
            self.weights_[(a, b)] = (wa, wb)
        self.n_maps_ = len(self.weights_)
        return self

    def transform(self, X: Any, view: int = 0) -> np.ndarray:
        """Model ``view``'s rows in its own preprocessed space (there is no shared space)."""
        return self._check_view(X, view)

    def embed_pair(self, X_src: Any, X_dst: Any, src: int, dst: int) -> tuple[np.ndarray, np.ndarray]:
        """Both models' canonical variates from the CCA fitted on this pair."""
        a, b = sorted((src, dst))
        wa, wb = self.weights_[(a, b)]
        w_src, w_dst = (wa, wb) if src == a else (wb, wa)
        return self._check_view(X_src, src) @ w_src, self._check_view(X_dst, dst) @ w_dst


class ConcatenatedViews(TransformerMixin, BaseEstimator):
    """A single-matrix front end: the columns of X are ``n_views`` concatenated views (split evenly).

    ``transform`` returns the mean of the views' embeddings in the shared space, the usual consensus
    representation. This makes the multi-view estimators usable in sklearn pipelines (and testable with
    ``parametrize_with_checks``).

    Example:
        >>> import numpy as np
        >>> X = np.random.default_rng(0).normal(size=(30, 6))
        >>> ConcatenatedViews(GeneralizedProcrustes(), n_views=2).fit_transform(X).shape
        (30, 3)
    """

    def __init__(self, estimator: Any = None, n_views: int = 2):
        self.estimator = estimator
        self.n_views = n_views

    def _split(self, X: np.ndarray) -> list[np.ndarray]:
        return np.array_split(X, self.n_views, axis=1)

    def fit(self, X: Any, y: Any = None) -> ConcatenatedViews:
        X = validate_data(self, X, dtype=np.float64, reset=True)
        if isinstance(self.n_views, bool) or not isinstance(self.n_views, int) or self.n_views < 2:
            raise ValueError(f"n_views must be an int >= 2, got {self.n_views!r}")
        if X.shape[1] < self.n_views:
            raise ValueError(
                f"X has {X.shape[1]} feature(s) but {self.n_views} views need at least "
                f"{self.n_views}; 1 feature(s) cannot be split"
            )
        if X.shape[0] < 2:
            raise ValueError("got 1 sample; alignment needs at least 2 anchors")
        base = self.estimator if self.estimator is not None else GeneralizedProcrustes()
        self.estimator_ = clone(base).fit(self._split(X))
        return self

    def transform(self, X: Any) -> np.ndarray:
        check_is_fitted(self, "estimator_")
        X = validate_data(self, X, dtype=np.float64, reset=False)
        return np.mean(self.estimator_.transform_views(self._split(X)), axis=0)
