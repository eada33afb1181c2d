r"""Per-sample group attributions of a task model through Captum, and the explanation every arm publishes.

Integrated gradients from the baseline x' (the training mean) to x, pooled over each feature group,

$$\mathrm{IG}_g(x) = \sum_{j \in g} (x_j - x'_j)\int_0^1 \partial_j f_{\hat y}(x' + a(x - x'))\,da,$$

computed by ``captum.attr.IntegratedGradients`` (Gauss-Legendre, ``n_steps`` points); also Captum's
``InputXGradient`` and ``FeatureAblation`` (group occlusion with the baseline). The explained class is the
model's prediction y_hat.

A client's published explanation of x (the fair protocol, the same for every arm that has a shared map P):

$$e(x) = \mathrm{rownorm}\big((1 - \beta)\,\mathrm{rownorm}(|\mathrm{IG}(x)|) + \beta\,P[\hat y]\big)$$

(``beta = 0``: Local-XAI; P = the Global Explanation Prior: xFedAlign; P = aggregated IG maps: FedAttr-Agg;
P = uniform: the sanity arm).

Example:
    >>> import numpy as np
    >>> from icml26.xfedalign.data import patch_groups
    >>> from icml26.xfedalign.models import ModelSpec, get_params, task_model
    >>> spec = ModelSpec(64, 10, 16)
    >>> params = get_params(task_model(64, 10, hidden=16, seed=0))
    >>> X = np.random.default_rng(0).random((5, 64)).astype(np.float32)
    >>> A, yhat = group_attributions(spec, params, X, np.zeros(64, np.float32), patch_groups())
    >>> A.shape, yhat.shape
    ((5, 16), (5,))

Reference: M. Sundararajan, A. Taly, Q. Yan, "Axiomatic attribution for deep networks", ICML 2017; Captum
(Kokhlikyan et al., 2020).
"""

from __future__ import annotations

import numpy as np
import torch

from ..common.optional import requires
from .core import align, normalize_rows
from .data import GroupSpec
from .models import ModelSpec, Params, load

METHODS = ("ig", "input_x_gradient", "occlusion")


def group_attributions(spec: ModelSpec, params: Params, X: np.ndarray, baseline: np.ndarray, groups: GroupSpec,
                       *, method: str = "ig", n_steps: int = 32, target: np.ndarray | None = None
                       ) -> tuple[np.ndarray, np.ndarray]:
    """Signed per-group attributions (n, G) of the predicted (or ``target``) class, and the classes explained.

    Args:
        spec, params: the task model.
        X: (n, d) inputs.
        baseline: (d,) reference input (IG's start point, occlusion's fill value).
        groups: the feature groups.
        method: ``"ig"`` (IntegratedGradients), ``"input_x_gradient"`` or ``"occlusion"`` (FeatureAblation
            over the groups).
        n_steps: IG integration points.
        target: classes to explain (default: the model's predictions).
    """
    attr = requires("captum.attr", extra="xai", purpose="attributions")
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    X = np.asarray(X, dtype=np.float32)
    if X.ndim != 2 or X.shape[1] != groups.n_features:
        raise ValueError(f"X must be (n, {groups.n_features}), got {X.shape}")
    if not np.isfinite(X).all():
        raise ValueError("X contains NaN or Inf")
    model = load(spec, params)
    Xt = torch.from_numpy(X)
    base = torch.as_tensor(np.asarray(baseline, dtype=np.float32)).reshape(1, -1)
    with torch.no_grad():
        pred = model(Xt).argmax(1)
    tgt = pred if target is None else torch.as_tensor(np.asarray(target, dtype=np.int64))
    if len(X) == 0:
        return np.zeros((0, groups.n_groups)), tgt.numpy()
    if method == "ig":
        A = attr.IntegratedGradients(model).attribute(Xt, baselines=base, target=tgt, n_steps=n_steps)
        pooled = groups.pool(A.detach().double().numpy())
    elif method == "input_x_gradient":
        A = attr.InputXGradient(model).attribute(Xt.clone().requires_grad_(True), target=tgt)
        pooled = groups.pool(A.detach().double().numpy())
    else:
        mask = torch.zeros(1, groups.n_features, dtype=torch.long)
        for g, idx in enumerate(groups.groups):
            mask[0, list(idx)] = g
        A = attr.FeatureAblation(model).attribute(Xt, baselines=base, target=tgt, feature_mask=mask)
        # every feature of a group carries the group's occlusion effect: read one per group
        pooled = A.detach().double().numpy()[:, [idx[0] for idx in groups.groups]]
    return pooled, tgt.numpy()


def local_maps(pooled: np.ndarray) -> np.ndarray:
    """Per-sample simplex maps rownorm(|a|) of signed group attributions."""
    return normalize_rows(np.abs(np.asarray(pooled, dtype=np.float64)))


def published_explanations(local: np.ndarray, classes: np.ndarray, prior: np.ndarray | None, beta: float
                           ) -> np.ndarray:
    """e(x) = rownorm((1 - beta) local(x) + beta prior[class(x)]); ``prior=None`` or beta = 0 gives local."""
    if prior is None or beta == 0:
        return normalize_rows(np.abs(local))
    return align(local, np.asarray(prior)[np.asarray(classes)], beta)
