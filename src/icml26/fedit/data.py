"""Generated and semi-real federated datasets for the independence test (seeded; nothing downloaded).

Every generator returns a list of (X_k, Y_k) pairs, one per client.

- ``shared_shifts`` (scenario A): client k's X and Y are shifted by mu_k = 3k and 2 mu_k and scaled differently;
  ``dep = 0`` is H0 (independent within every client), ``dep > 0`` a sine dependence. Pooling creates spurious
  dependence because the client shifts of X and Y co-vary. Any client sizes (``sizes``): the validity panel with
  many small clients (20 x 8, 50 x 6, ``MIXED_SIZES``) uses it.
- ``sign_flips`` (scenario B): the dependence is linear with a sign that alternates across clients.
- ``monotone_shifts``: client-specific non-linear monotone maps of both marginals (exp, cube, logistic) plus
  shared shifts; different client sizes.
- ``diabetes_clients``: sklearn's bundled diabetes data split into clients by age quartile, X = bmi,
  Y = disease progression; ``null=True`` permutes Y within each client (independence by construction).

Example:
    >>> clients = shared_shifts(np.random.default_rng(0), dep=0.0)
    >>> len(clients), clients[0][0].shape
    (5, (80, 1))
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import numpy as np

Clients = list[tuple[np.ndarray, np.ndarray]]

MIXED_SIZES = (5, 5, 5, 6, 6, 6, 7, 8, 8, 10, 12, 25, 40, 60, 200)
"""Client sizes of the mixed small-client scenario: eleven sites of 5 to 12 rows beside four larger ones (the
sizes of the first implementation's audit, [12, 25, 60, 200, 40], with many small sites added)."""


def shared_shifts(rng: np.random.Generator, *, K: int = 5, n: int = 80, dep: float = 0.0,
                  sizes: Sequence[int] | None = None) -> Clients:
    """Scenario A (the design's prototype): shared location/scale shifts, optional sine dependence.

    ``sizes`` gives each client's number of rows (then K = len(sizes)); else K clients of n rows."""
    sizes = [n] * K if sizes is None else [int(s) for s in sizes]
    out = []
    for k, n in enumerate(sizes):
        mu = 3.0 * k
        x = mu + (1 + 0.5 * k) * rng.normal(size=n)
        z, e = rng.normal(size=n), rng.normal(size=n)
        y = 2 * mu + (1 + 0.3 * k) * (dep * np.sin(2 * (x - mu)) + (1 - dep) * z) + 0.3 * e
        out.append((x[:, None], y[:, None]))
    return out


def sign_flips(rng: np.random.Generator, *, K: int = 6, n: int = 80, dep: float = 0.25) -> Clients:
    """Scenario B: linear dependence whose sign alternates across clients."""
    out = []
    for k in range(K):
        mu, s = 3.0 * k, 1.0 if k % 2 == 0 else -1.0
        x = mu + (1 + 0.5 * k) * rng.normal(size=n)
        y = 2 * mu + s * dep * (x - mu) / (1 + 0.5 * k) + (1 - dep) * rng.normal(size=n)
        out.append((x[:, None], y[:, None]))
    return out


def monotone_shifts(rng: np.random.Generator, *, K: int = 5, dep: float = 0.0) -> Clients:
    """Client-specific non-linear monotone marginal maps, shared shifts, client sizes 40 to 160."""
    maps = [lambda t: t, np.exp, lambda t: t**3, lambda t: 1 / (1 + np.exp(-t)), np.sinh]
    out = []
    for k in range(K):
        n = int(rng.integers(40, 161))
        base_x, z = rng.normal(size=n), rng.normal(size=n)
        base_y = dep * base_x + np.sqrt(1 - dep**2) * z
        f = maps[k % len(maps)]
        out.append(((2.0 * k + f(base_x))[:, None], (3.0 * k + f(base_y))[:, None]))
    return out


@functools.cache
def _diabetes() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(age, bmi, progression) of sklearn's bundled diabetes data, read once (read-only arrays)."""
    from sklearn.datasets import load_diabetes

    data = load_diabetes()
    out = (data.data[:, 0].copy(), data.data[:, 2].copy(), data.target.copy())
    for a in out:
        a.flags.writeable = False
    return out


def diabetes_clients(rng: np.random.Generator, *, null: bool = False, K: int = 4) -> Clients:
    """sklearn's diabetes data (442 patients) split by age quantile; X = bmi, Y = progression."""
    age, bmi, target = _diabetes()
    edges = np.quantile(age, np.linspace(0, 1, K + 1))
    groups = np.clip(np.searchsorted(edges, age, side="right") - 1, 0, K - 1)
    out = []
    for k in range(K):
        idx = np.flatnonzero(groups == k)
        y = target[idx].copy()
        if null:
            y = y[rng.permutation(len(y))]
        out.append((bmi[idx][:, None], y[:, None]))
    return out
