"""Probe toolkit and the linear-versus-non-linear erasure dichotomy.

- :func:`probe_outcomes`: fit a linear (logistic regression) or MLP probe on one split, return its 0/1
  correctness on a disjoint split (per item, so probes pair across conditions);
- :func:`fit_leace`: a LEACE eraser (Belrose et al., 2023) through the ``concept-erasure`` package,

  .. math:: r(x) = x - W^{+} P W (x - \\mu_X),\\quad W = (\\Sigma_{XX}^{1/2})^{+},\\
     P = \\text{orthogonal projection onto } \\operatorname{colspace}(W \\Sigma_{XZ}),

  the affine map of least mean squared change after which no linear classifier beats a constant predictor of Z;
- :func:`synthetic_concepts`: Gaussian features with a *linear* concept (the sign of a random direction) and an
  *XOR* concept (the product of two coordinates' signs), the paper's linear and non-linear settings;
- :func:`erasure_dichotomy`: probe accuracy before and after LEACE for both concepts.

LEACE removes every linearly decodable trace of a concept, so after it a linear probe is at chance for both
concepts; a concept that is not linearly encoded (XOR: both classes have the same mean) leaves LEACE nothing to
remove, and an MLP probe still reads it. Fit erasers and probes on disjoint splits with n >> d: fitted on
the rows it is scored on, a probe falls *below* chance after erasure (a small-sample artefact).

Example:
    >>> d = synthetic_concepts(n=1200, dim=16, seed=0)
    >>> out = erasure_dichotomy(d, seed=0)
    >>> out["xor"]["mlp_after"] > 0.75 > out["linear"]["linear_after"]
    True
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np

PROBES = ("linear", "mlp")


def _check_xy(X: Any, y: Any, name: str) -> tuple[np.ndarray, np.ndarray]:
    X = np.asarray(X, dtype=np.float64)
    y = np.asarray(y)
    if X.ndim != 2 or y.ndim != 1 or len(X) != len(y):
        raise ValueError(f"{name}: X must be (n, d) and y (n,), got {X.shape} and {y.shape}")
    if len(X) < 2:
        raise ValueError(f"{name}: need at least 2 rows, got {len(X)}")
    if not np.all(np.isfinite(X)):
        raise ValueError(f"{name}: X has NaN or infinite values")
    return X, y


def probe_outcomes(X_train: Any, y_train: Any, X_test: Any, y_test: Any, *, kind: str = "linear",
                   seed: int = 0, hidden: int = 64) -> np.ndarray:
    """Fit a probe on (X_train, y_train) and return 1.0/0.0 per test row (correct or not).

    Args:
        kind: ``"linear"`` (L2 logistic regression, C = 1) or ``"mlp"`` (one ReLU layer of ``hidden`` units,
            L-BFGS, L2 penalty 1e-2), both on standardised features.
        seed: the MLP's initialisation seed.

    Raises:
        ValueError: unknown kind, shapes that disagree, NaN/Inf features, or a single class in training.
    """
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.linear_model import LogisticRegression
    from sklearn.neural_network import MLPClassifier
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    if kind not in PROBES:
        raise ValueError(f"kind must be one of {PROBES}, got {kind!r}")
    X_train, y_train = _check_xy(X_train, y_train, "train")
    X_test, y_test = _check_xy(X_test, y_test, "test")
    if X_train.shape[1] != X_test.shape[1]:
        raise ValueError(f"train and test have {X_train.shape[1]} and {X_test.shape[1]} features")
    if len(np.unique(y_train)) < 2:
        raise ValueError("y_train has a single class; a probe needs both")
    if kind == "linear":
        clf = LogisticRegression(C=1.0, max_iter=5000)
    else:
        clf = MLPClassifier(hidden_layer_sizes=(hidden,), solver="lbfgs", max_iter=1000, alpha=1e-2,
                            random_state=seed)
    with warnings.catch_warnings():  # an unconverged probe is still a probe; its accuracy is what is reported
        warnings.simplefilter("ignore", ConvergenceWarning)
        model = make_pipeline(StandardScaler(), clf).fit(X_train, y_train)
    return (model.predict(X_test) == y_test).astype(float)


def fit_leace(X: Any, z: Any) -> Any:
    """A ``concept_erasure.LeaceEraser`` fitted on features ``X`` (n, d) and concept labels ``z`` (n,)."""
    import torch

    from ..common.optional import requires

    ce = requires("concept_erasure", extra="coca", purpose="LEACE concept erasure")
    X, z = _check_xy(X, z, "leace")
    if len(np.unique(z)) < 2:
        raise ValueError("z has a single class; there is no concept to erase")
    return ce.LeaceEraser.fit(torch.as_tensor(X, dtype=torch.float64), torch.as_tensor(z, dtype=torch.float64))


def apply_eraser(eraser: Any, X: Any) -> np.ndarray:
    """``eraser(X)`` as a float64 array."""
    import torch

    X = np.asarray(X, dtype=np.float64)
    return eraser(torch.as_tensor(X, dtype=torch.float64)).numpy()


def synthetic_concepts(n: int = 4000, dim: int = 32, *, noise: float = 0.5, seed: int = 0) -> dict[str, np.ndarray]:
    """Features ``X ~ N(0, I)`` with two binary concepts: ``linear`` = 1[u.X + noise > 0] (u a random unit
    vector) and ``xor`` = 1[X_0 > 0] XOR 1[X_1 > 0]; rows split in halves (``train`` indices first)."""
    if n < 8 or dim < 2:
        raise ValueError(f"need n >= 8 and dim >= 2, got n={n}, dim={dim}")
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, dim))
    u = rng.standard_normal(dim)
    u /= np.linalg.norm(u)
    linear = (X @ u + noise * rng.standard_normal(n) > 0).astype(int)
    xor = ((X[:, 0] > 0) ^ (X[:, 1] > 0)).astype(int)
    return {"X": X, "linear": linear, "xor": xor, "train": np.arange(n // 2), "test": np.arange(n // 2, n)}


def erasure_dichotomy(data: dict[str, np.ndarray], *, concepts: Sequence[str] = ("linear", "xor"),
                      seed: int = 0) -> dict[str, dict[str, float]]:
    """Linear and MLP probe test accuracy before and after LEACE, per concept (eraser and probes fitted on the
    train rows, scored on the test rows), and the relative norm of the edit ``||r(x) - x|| / ||x||``."""
    X, tr, te = data["X"], data["train"], data["test"]
    out: dict[str, dict[str, float]] = {}
    for c in concepts:
        z = data[c]
        eraser = fit_leace(X[tr], z[tr])
        Xe = apply_eraser(eraser, X)
        row: dict[str, float] = {}
        for kind in PROBES:
            row[f"{kind}_before"] = float(probe_outcomes(X[tr], z[tr], X[te], z[te], kind=kind, seed=seed).mean())
            row[f"{kind}_after"] = float(probe_outcomes(Xe[tr], z[tr], Xe[te], z[te], kind=kind, seed=seed).mean())
        row["edit_norm"] = float(np.mean(np.linalg.norm(Xe[te] - X[te], axis=1) / np.linalg.norm(X[te], axis=1)))
        out[c] = row
    return out
