"""The embedded default: sklearn's bundled digits and breast-cancer data, split over clients (nothing downloaded).

A ``FederatedTask`` holds one world: the clients' local data (train / validation / test, each client's own
distribution), the feature groups explanations live in, and the baseline (the training mean) that integrated
gradients and deletion/insertion use.

- **digits** (8x8 images, 10 classes, 1,797 samples), pixels scaled to [0, 1]; groups = the 16 2x2 patches.
- **cancer** (breast_cancer, 30 features, 2 classes, 569 samples), standardised with training statistics;
  groups = the 10 measurements, each with its mean / standard-error / worst value (3 features).
- partitions: ``"iid"`` (a seeded shuffle cut into equal parts) or ``"dirichlet"`` (per-class client shares
  drawn from Dirichlet(alpha), resampled until every client has ``min_size`` samples); with ``"dirichlet"``
  the digits clients also get a fixed covariate shift, a band of two pixel rows erased to the baseline
  (the official code's client-specific erasing bands).

Example:
    >>> task = load_task("digits", "dirichlet", n_clients=4, seed=0)
    >>> task.n_groups, task.n_classes, len(task.clients)
    (16, 10, 4)
    >>> sum(len(c.y_train) + len(c.y_val) + len(c.y_test) for c in task.clients)
    1797
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

DATASETS = ("digits", "cancer")
PARTITIONS = ("iid", "dirichlet")


@dataclass(frozen=True)
class GroupSpec:
    """Feature groups: ``groups[g]`` holds the feature indices of group g (disjoint, covering all features)."""

    groups: tuple[tuple[int, ...], ...]
    n_features: int
    names: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.groups:
            raise ValueError("groups must hold at least one group")
        flat = [j for g in self.groups for j in g]
        if any(len(g) == 0 for g in self.groups):
            raise ValueError("groups must not be empty")
        if sorted(flat) != list(range(self.n_features)):
            raise ValueError(f"groups must partition the {self.n_features} features exactly once each")

    @property
    def n_groups(self) -> int:
        return len(self.groups)

    def matrix(self) -> np.ndarray:
        """The (d, G) 0/1 membership matrix M: group sums are ``A @ M``."""
        M = np.zeros((self.n_features, self.n_groups))
        for g, idx in enumerate(self.groups):
            M[list(idx), g] = 1.0
        return M

    def pool(self, A: np.ndarray) -> np.ndarray:
        """Sum the last axis (features) of ``A`` within each group: (..., d) -> (..., G)."""
        A = np.asarray(A, dtype=np.float64)
        if A.shape[-1] != self.n_features:
            raise ValueError(f"attributions have {A.shape[-1]} features but the groups cover {self.n_features}")
        return A @ self.matrix()


def patch_groups(height: int = 8, width: int = 8, patch: int = 2) -> GroupSpec:
    """Square ``patch`` x ``patch`` pixel patches of a row-major ``height`` x ``width`` image."""
    if height % patch or width % patch:
        raise ValueError(f"patch {patch} must divide the image size {height}x{width}")
    groups, names = [], []
    for pr in range(height // patch):
        for pc in range(width // patch):
            groups.append(tuple((pr * patch + r) * width + pc * patch + c for r in range(patch) for c in range(patch)))
            names.append(f"patch({pr},{pc})")
    return GroupSpec(tuple(groups), height * width, tuple(names))


def cancer_groups() -> GroupSpec:
    """breast_cancer's 30 features as its 10 measurements x (mean, standard error, worst)."""
    from sklearn.datasets import load_breast_cancer

    names = [n.replace("mean ", "") for n in load_breast_cancer().feature_names[:10]]
    return GroupSpec(tuple((j, j + 10, j + 20) for j in range(10)), 30, tuple(names))


@dataclass
class ClientData:
    """One client's local data (its own distribution): train / validation / test splits."""

    X_train: np.ndarray
    y_train: np.ndarray
    X_val: np.ndarray
    y_val: np.ndarray
    X_test: np.ndarray
    y_test: np.ndarray
    shift: str = "none"
    """the client's covariate shift, in words"""
    cid: int = 0
    """the client's index (its partition id): seeds its local randomness"""
    attacker: int | None = None
    """a poisoning client's trigger group (``None``: an honest client); read by ``attacks.PoisonedXFedAlign``"""
    rows: dict[str, np.ndarray] = field(default_factory=dict)
    """``{"train", "val", "test"}``: each split's rows in the bundled data set (what each item is; empty when the
    client's data came from elsewhere, e.g. a Flower node's own arrays)"""


@dataclass
class FederatedTask:
    """One embedded world: clients, groups, classes and the baseline input."""

    name: str
    partition: str
    clients: list[ClientData]
    groups: GroupSpec
    n_classes: int
    baseline: np.ndarray
    """the training mean of the features (the reference input of IG and deletion/insertion)"""
    class_names: tuple[str, ...] = field(default_factory=tuple)

    @property
    def n_features(self) -> int:
        return self.groups.n_features

    @property
    def n_groups(self) -> int:
        return self.groups.n_groups

    def pooled(self, split: str) -> tuple[np.ndarray, np.ndarray]:
        """All clients' ``split`` (train / val / test) rows, client by client."""
        X = np.concatenate([getattr(c, f"X_{split}") for c in self.clients])
        y = np.concatenate([getattr(c, f"y_{split}") for c in self.clients])
        return X, y


def dirichlet_partition(y: np.ndarray, n_clients: int, alpha: float, rng: np.random.Generator,
                        min_size: int = 10, max_tries: int = 1000) -> list[np.ndarray]:
    """Label-skewed split: class c's samples go to clients in proportions drawn from Dirichlet(alpha).

    Resampled until every client holds at least ``min_size`` samples (the flwr-datasets rule).

    Returns:
        One index array per client (sorted).
    """
    if n_clients < 1:
        raise ValueError(f"n_clients must be >= 1, got {n_clients}")
    if not alpha > 0:
        raise ValueError(f"alpha must be > 0, got {alpha}")
    if n_clients * min_size > len(y):
        raise ValueError(f"{n_clients} clients x min_size {min_size} exceed the {len(y)} samples")
    for _ in range(max_tries):
        parts: list[list[int]] = [[] for _ in range(n_clients)]
        for c in np.unique(y):
            idx = rng.permutation(np.flatnonzero(y == c))
            shares = rng.dirichlet(np.full(n_clients, alpha))
            cuts = (np.cumsum(shares)[:-1] * len(idx)).astype(int)
            for k, chunk in enumerate(np.split(idx, cuts)):
                parts[k].extend(chunk.tolist())
        if min(len(p) for p in parts) >= min_size:
            return [np.sort(np.asarray(p, dtype=np.int64)) for p in parts]
    raise RuntimeError(f"no Dirichlet({alpha}) split gave every client {min_size} samples in {max_tries} tries")


def iid_partition(n: int, n_clients: int, rng: np.random.Generator) -> list[np.ndarray]:
    """A seeded shuffle of ``range(n)`` cut into ``n_clients`` near-equal parts."""
    if n_clients < 1 or n_clients > n:
        raise ValueError(f"n_clients must be in [1, {n}], got {n_clients}")
    return [np.sort(p) for p in np.array_split(rng.permutation(n), n_clients)]


def _split_client(idx: np.ndarray, rng: np.random.Generator, fractions: Sequence[float]) -> list[np.ndarray]:
    """A client's own rows cut into train / val / test by a seeded shuffle."""
    perm = rng.permutation(idx)
    n = len(perm)
    n_val, n_test = max(1, round(fractions[1] * n)), max(2, round(fractions[2] * n))
    return [np.sort(perm[n_val + n_test:]), np.sort(perm[:n_val]), np.sort(perm[n_val:n_val + n_test])]


def load_task(name: str = "digits", partition: str = "dirichlet", *, n_clients: int = 8, seed: int = 0,
              alpha: float = 0.3, min_size: int = 20, splits: Sequence[float] = (0.6, 0.2, 0.2)) -> FederatedTask:
    """Build one embedded world.

    Args:
        name: ``"digits"`` or ``"cancer"``.
        partition: ``"iid"`` or ``"dirichlet"`` (label skew, plus erased bands on digits).
        n_clients: number of clients.
        seed: seed of the partition and of the clients' splits.
        alpha: Dirichlet concentration (smaller: more skew).
        min_size: fewest samples a client may hold.
        splits: each client's train / validation / test fractions.

    Returns:
        The ``FederatedTask``.
    """
    if name not in DATASETS:
        raise ValueError(f"name must be one of {DATASETS}, got {name!r}")
    if partition not in PARTITIONS:
        raise ValueError(f"partition must be one of {PARTITIONS}, got {partition!r}")
    if len(splits) != 3 or abs(sum(splits) - 1.0) > 1e-9 or min(splits) <= 0:
        raise ValueError(f"splits must be three positive fractions summing to 1, got {tuple(splits)}")
    rng = np.random.default_rng([seed, 7919])
    if name == "digits":
        from sklearn.datasets import load_digits

        data = load_digits()
        X, y = data.data / 16.0, data.target.astype(np.int64)
        groups, class_names = patch_groups(8, 8, 2), tuple(str(c) for c in range(10))
    else:
        from sklearn.datasets import load_breast_cancer

        data = load_breast_cancer()
        X, y = data.data.astype(np.float64), data.target.astype(np.int64)
        groups, class_names = cancer_groups(), tuple(data.target_names)
    parts = (iid_partition(len(y), n_clients, rng) if partition == "iid"
             else dirichlet_partition(y, n_clients, alpha, rng, min_size=min_size))
    split_idx = [_split_client(p, rng, splits) for p in parts]
    train_rows = np.concatenate([s[0] for s in split_idx])
    if name == "cancer":  # standardise with the training rows' statistics (a federated mean/variance)
        mean, std = X[train_rows].mean(0), X[train_rows].std(0)
        X = (X - mean) / np.where(std > 0, std, 1.0)
    baseline = X[train_rows].mean(0)
    clients = []
    for k, (tr, va, te) in enumerate(split_idx):
        Xk = X.copy()
        shift = "none"
        if name == "digits" and partition == "dirichlet":
            rows = (2 * (k % 4), 2 * (k % 4) + 1)
            cols = [r * 8 + c for r in rows for c in range(8)]
            Xk[:, cols] = baseline[cols]  # erased to the baseline: the band carries no information
            shift = f"pixel rows {rows[0]}-{rows[1]} erased"
        clients.append(ClientData(Xk[tr].astype(np.float32), y[tr], Xk[va].astype(np.float32), y[va],
                                  Xk[te].astype(np.float32), y[te], shift=shift, cid=k,
                                  rows={"train": tr, "val": va, "test": te}))
    return FederatedTask(name, partition, clients, groups, int(y.max()) + 1, baseline.astype(np.float32),
                         class_names)
