r"""xFedAlign's framework-free core: surrogate, private top-k artifact, robust prior, alignment; the algorithm.

Task learning is plain FedAvg in parameter space; explanation coordination runs beside it in a compact group
space of G feature groups (C classes):

1. **Surrogate** (client): a sparse linear model g(z) = W z + b on the client's standardised features z,
   distilled from its task model f by soft-label cross-entropy with an L1 penalty,

   $$\min_{W,b}\ \tfrac1n \textstyle\sum_i \mathrm{CE}\big(\mathrm{softmax}(f(x_i)/T),\ \mathrm{softmax}(W z_i + b)\big)
     + \lambda \lVert W \rVert_1$$

   (FISTA, full batch), and its group map S[c, g] = sum_{j in g} |W_cj|.
2. **Private artifact** (client): every class row scaled to unit L2 norm (the clipping step, R = 1) and a 0/1
   presence indicator per class (the client holds at least ``min_class_count`` samples of it), Gaussian noise
   N(0, sigma^2) on all C x (G + 1) coordinates, then -- post-processing only -- the top-k groups per class,
   quantised to 8 bits with one scale, and the presence bits thresholded at 1/2. Only k (index, value) pairs per
   class and C bits leave the client: C k (1 + 1) bytes + ceil(C/8) + a header. No count leaves in clear.
3. **Global Explanation Prior** (server): the dequantised rows renormalised onto the simplex, aggregated per
   class over the clients that hold the class by a coordinate-wise median (or trimmed mean, or mean),
   renormalised, and smoothed, $$\Pi \leftarrow \mathrm{rownorm}\big(e\,\Pi + (1 - e)\,\Pi_{new}\big)$$ (e = 0.6;
   Pi starts uniform).
4. **Soft alignment** (client, at explanation time; the task loss never sees Pi):
   $$S_{mix} = \mathrm{rownorm}\big((1 - \beta) S + \beta\,\Pi\big)$$

**Privacy, stated honestly.** Step 2's noise is the Gaussian mechanism on a vector whose map rows have unit norm
and are non-negative (each moves by at most sqrt(2)) and whose presence coordinates are 0 or 1 (each moves by
at most 1), so *any* change of the client's data (one record or all of them) moves it by at most
Delta = sqrt(3 C) in L2: a client-level bound. Top-k, quantisation, thresholding and normalisation are
post-processing. One release is rho = Delta^2 / (2 sigma^2) = 3 C / (2 sigma^2) zero-concentrated DP; R rounds
compose to R rho, reported as (epsilon, delta) by ``zcdp_epsilon`` (``sigma_for_epsilon`` is its inverse). What is **not** accounted: the task-model parameters every client sends
(plain FedAvg), which carry far more about the data than the artifact. xFedAlign's explanation channel can be
made DP; the client's whole release is not. The official code adds noise (``dp_sigma``) after quantisation and
top-k selection, which leaks the support and has no accounting.

Example:
    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> S = rng.random((3, 6))
    >>> art = make_artifact(S, topk=2, noise_sigma=0.0, rng=rng)
    >>> art.indices.shape, art.nbytes
    ((3, 2), 25)
    >>> prior = aggregate_prior([art.dense(6), art.dense(6)], method="median")
    >>> np.allclose(prior.sum(1), 1.0)
    True

Reference: "Explainable Federated Learning via Global-Local Attribution Alignment" (xFedAlign), ICML 2026, poster
62427, and its official scripts (dawoodwasif/xFedAlign, MIT); M. Bun and T. Steinke, "Concentrated differential
privacy", TCC 2016 (zCDP of the Gaussian mechanism and its conversion to (epsilon, delta)).
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..common.federation import FederatedAlgorithm

AGGREGATIONS = ("median", "trimmed_mean", "mean")


# ------------------------------------------------------------------------------------------------ validation
def _finite(name: str, A: np.ndarray) -> np.ndarray:
    if not np.isfinite(A).all():
        raise ValueError(f"{name} contains NaN or Inf")
    return A


def _nonneg_scalar(name: str, value: Any, *, positive: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__}")
    value = float(value)
    if not math.isfinite(value) or value < 0 or (positive and value == 0):
        raise ValueError(f"{name} must be a finite number {'> 0' if positive else '>= 0'}, got {value!r}")
    return value


def normalize_rows(A: np.ndarray) -> np.ndarray:
    """Rows of a non-negative matrix scaled to sum 1 (a row of zeros becomes uniform)."""
    A = np.asarray(A, dtype=np.float64)
    if (A < 0).any():
        raise ValueError("normalize_rows needs non-negative entries")
    s = A.sum(axis=-1, keepdims=True)
    uniform = np.full_like(A, 1.0 / A.shape[-1])
    return np.where(s > 0, A / np.where(s > 0, s, 1.0), uniform)


def jsd(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    r"""Jensen-Shannon divergence in bits along the last axis, in [0, 1].

    $$\mathrm{JSD}(p\|q) = \tfrac12 \mathrm{KL}(p\|m) + \tfrac12 \mathrm{KL}(q\|m),\quad m = (p + q)/2$$
    """
    p, q = np.asarray(p, dtype=np.float64), np.asarray(q, dtype=np.float64)
    m = 0.5 * (p + q)

    def kl(a: np.ndarray) -> np.ndarray:
        with np.errstate(divide="ignore", invalid="ignore"):
            terms = np.where(a > 0, a * np.log2(np.where(a > 0, a, 1.0) / np.where(m > 0, m, 1.0)), 0.0)
        return terms.sum(axis=-1)

    return np.clip(0.5 * kl(p) + 0.5 * kl(q), 0.0, 1.0)


# ------------------------------------------------------------------------------------------------ surrogate
@dataclass(frozen=True)
class Surrogate:
    """A linear surrogate on standardised inputs: logits = ((x - mean) / scale) @ W.T + b."""

    W: np.ndarray
    b: np.ndarray
    mean: np.ndarray
    scale: np.ndarray

    def logits(self, X: np.ndarray) -> np.ndarray:
        return ((np.asarray(X, dtype=np.float64) - self.mean) / self.scale) @ self.W.T + self.b

    def group_map(self, membership: np.ndarray) -> np.ndarray:
        """S[c, g] = sum_{j in g} |W_cj| (``membership``: the (d, G) 0/1 matrix of the groups)."""
        return np.abs(self.W) @ membership


def softmax(Z: np.ndarray) -> np.ndarray:
    Z = Z - Z.max(axis=1, keepdims=True)
    E = np.exp(Z)
    return E / E.sum(axis=1, keepdims=True)


def surrogate_objective(W: np.ndarray, b: np.ndarray, Z: np.ndarray, P: np.ndarray, l1: float) -> float:
    """The distillation objective at (W, b): mean soft-label cross-entropy + l1 ||W||_1."""
    logq = np.log(np.clip(softmax(Z @ W.T + b), 1e-300, None))
    return float(-(P * logq).sum(axis=1).mean() + l1 * np.abs(W).sum())


def distill_surrogate(teacher: Callable[[np.ndarray], np.ndarray] | np.ndarray, X: np.ndarray, *,
                      temperature: float = 3.0, l1: float = 1e-3, iters: int = 100) -> Surrogate:
    r"""Distil a sparse linear surrogate from a teacher's temperature-softened outputs (FISTA, full batch).

    $$\min_{W,b} \tfrac1n\sum_i -\sum_c p_{ic}\log \mathrm{softmax}(W z_i + b)_c + \lambda\lVert W\rVert_1,\quad
      p_i = \mathrm{softmax}(f(x_i)/T),\ z_i = (x_i - \mu)/s$$

    Features are standardised with the client's own mean and standard deviation (a constant feature gets scale
    1 and, having no signal, a zero weight), so lambda does not depend on how the inputs were preprocessed.

    Args:
        teacher: the task model's logits for ``X`` (an (n, C) array) or a callable returning them.
        X: (n, d) inputs.
        temperature: T > 0 of the soft labels (paper code: 3.0 on MNIST).
        l1: lambda >= 0 of the L1 penalty on W (not on b).
        iters: FISTA iterations (step 1/L with L = ||[Z 1]||_2^2 / (2 n), Boehning's bound).

    Returns:
        The ``Surrogate`` (W: (C, d)).
    """
    X = _finite("X", np.asarray(X, dtype=np.float64))
    if X.ndim != 2 or X.shape[0] < 2:
        raise ValueError(f"X must be a 2-D array with at least 2 rows, got shape {X.shape}")
    logits = np.asarray(teacher(X) if callable(teacher) else teacher, dtype=np.float64)
    if logits.ndim != 2 or logits.shape[0] != X.shape[0]:
        raise ValueError(f"the teacher's logits must be (n, C) with n = {X.shape[0]}, got {logits.shape}")
    _finite("teacher logits", logits)
    temperature = _nonneg_scalar("temperature", temperature, positive=True)
    l1 = _nonneg_scalar("l1", l1)
    if not isinstance(iters, int) or iters < 1:
        raise ValueError(f"iters must be a positive int, got {iters!r}")
    n, _ = X.shape
    mean, std = X.mean(0), X.std(0)
    scale = np.where(std > 1e-12, std, 1.0)
    Z = (X - mean) / scale
    # $$p_i = \mathrm{softmax}(f(x_i)/T)$$
    P = softmax(logits / temperature)
    C = P.shape[1]
    Z1 = np.hstack([Z, np.ones((n, 1))])
    Z1T = Z1.T.copy()
    L = 0.5 * np.linalg.norm(Z1, 2) ** 2 / n
    step = 1.0 / L
    Wb = np.zeros((Z1.shape[1], C))   # transposed: rows = features (+ bias), columns = classes
    Y, t = Wb.copy(), 1.0
    shrink = step * l1
    for _ in range(iters):
        Q = Z1 @ Y
        Q -= Q.max(axis=1, keepdims=True)
        np.exp(Q, out=Q)
        Q /= Q.sum(axis=1, keepdims=True)
        Q -= P
        new = Y - (step / n) * (Z1T @ Q)
        # proximal step of lambda ||W||_1 (the bias row is not penalised)
        W = new[:-1]
        np.copysign(np.maximum(np.abs(W) - shrink, 0.0), W, out=W)
        t_next = 0.5 * (1 + math.sqrt(1 + 4 * t * t))
        Y = new + ((t - 1) / t_next) * (new - Wb)
        Wb, t = new, t_next
    Wb = Wb.T
    return Surrogate(Wb[:, :-1].copy(), Wb[:, -1].copy(), mean, scale)


# ------------------------------------------------------------------------------------------------- artifact
@dataclass(frozen=True)
class SparseArtifact:
    """What a client sends: per class the top-k groups, 8-bit values with one scale, and noised presence bits.

    ``indices`` (C, k) uint8 (uint16 when G > 256), ``values`` (C, k) uint8, ``scale`` (a float32 on the wire),
    ``present`` (C,) booleans, whether the client holds the class (one bit each on the wire; a class whose bit is
    off does not enter the prior). The bits are released through the same Gaussian mechanism as the map
    (``make_artifact``), so no count leaves the client in clear.
    """

    indices: np.ndarray
    values: np.ndarray
    scale: float
    present: np.ndarray
    n_groups: int
    quant_bits: int = 8

    @property
    def n_classes(self) -> int:
        return int(self.indices.shape[0])

    @property
    def topk(self) -> int:
        return int(self.indices.shape[1])

    def dense(self, n_groups: int | None = None) -> np.ndarray:
        """The dequantised (C, G) map, rows renormalised onto the simplex (all-zero rows become uniform)."""
        G = self.n_groups if n_groups is None else n_groups
        if G != self.n_groups:
            raise ValueError(f"artifact has {self.n_groups} groups, expected {G}")
        out = np.zeros((self.n_classes, G))
        levels = (1 << self.quant_bits) - 1
        rows = np.arange(self.n_classes)[:, None]
        out[rows, self.indices.astype(np.int64)] = self.values.astype(np.float64) * (self.scale / levels)
        return normalize_rows(out)

    def to_bytes(self) -> bytes:
        """Wire format: header (C, k, G, bits: 4 x uint16; scale: float32), presence bits (ceil(C/8) bytes),
        indices, values."""
        C, k = self.indices.shape
        head = struct.pack("<4Hf", C, k, self.n_groups, self.quant_bits, float(self.scale))
        idx_dtype = "<u1" if self.n_groups <= 256 else "<u2"
        return (head + np.packbits(np.asarray(self.present, dtype=bool)).tobytes()
                + self.indices.astype(idx_dtype).tobytes() + self.values.astype("<u1").tobytes())

    @classmethod
    def from_bytes(cls, data: bytes) -> SparseArtifact:
        """The inverse of ``to_bytes``."""
        C, k, G, bits, scale = struct.unpack_from("<4Hf", data, 0)
        off = struct.calcsize("<4Hf")
        n_bits = -(-C // 8)
        present = np.unpackbits(np.frombuffer(data, "<u1", n_bits, off), count=C).astype(bool)
        off += n_bits
        idx_dtype = "<u1" if G <= 256 else "<u2"
        width = 1 if G <= 256 else 2
        indices = np.frombuffer(data, idx_dtype, C * k, off).reshape(C, k).copy()
        off += width * C * k
        values = np.frombuffer(data, "<u1", C * k, off).reshape(C, k).copy()
        return cls(indices, values, float(scale), present, int(G), int(bits))

    @property
    def nbytes(self) -> int:
        """Size of ``to_bytes()``."""
        return len(self.to_bytes())

    def to_payload(self) -> dict[str, Any]:
        """The artifact as federation payload fields (arrays and scalars)."""
        return {"art_indices": self.indices, "art_values": self.values, "art_scale": float(self.scale),
                "art_present": np.asarray(self.present, dtype=bool), "art_groups": int(self.n_groups),
                "art_bits": int(self.quant_bits)}

    @classmethod
    def from_payload(cls, payload: dict[str, Any]) -> SparseArtifact:
        return cls(np.asarray(payload["art_indices"]), np.asarray(payload["art_values"]),
                   float(payload["art_scale"]), np.asarray(payload["art_present"], dtype=bool),
                   int(payload["art_groups"]), int(payload["art_bits"]))


def make_artifact(S: np.ndarray, topk: int, *, noise_sigma: float = 0.1, quant_bits: int = 8,
                  rng: np.random.Generator | None = None, counts: Sequence[int] | None = None,
                  min_count: int = 1) -> SparseArtifact:
    r"""The client's private top-k artifact of a (C, G) non-negative group map, with noised class-presence bits.

    Clip (rows to unit L2 norm), noise the map and the presence indicators h_c = 1[count_c >= m] (one Gaussian
    mechanism on the (C, G + 1) vector [U | h]), then post-processing:

    $$\tilde S_c = S_c/\lVert S_c\rVert_2 + \mathcal N(0, \sigma^2 I_G),\quad
      \tilde h_c = h_c + \mathcal N(0, \sigma^2),$$
    keep the top-k of max(S~_c, 0) quantised to 2^b - 1 levels, and the bit 1[h~_c > 1/2].

    Sensitivity (client level: any change of the client's data): each map row moves by at most sqrt(2) (unit norm,
    non-negative), each bit by 1, so Delta = sqrt(3 C) (``zcdp_epsilon``).

    Args:
        S: (C, G) non-negative group importances (e.g. ``Surrogate.group_map``).
        topk: k, groups kept per class, 1 <= k <= G.
        noise_sigma: sigma >= 0 of the Gaussian noise (0: no privacy; see ``zcdp_epsilon``).
        quant_bits: bits per value, 1..8.
        rng: the noise's generator (needed when ``noise_sigma > 0``).
        counts: samples of each class the client holds (default: all 1). Only h_c leaves the client.
        min_count: m, the samples of a class a client must hold for its row to enter the prior (a public setting).

    Returns:
        The ``SparseArtifact``.

    Example:
        >>> import numpy as np
        >>> art = make_artifact(np.eye(3, 5), 2, noise_sigma=0.0, counts=[4, 0, 1], min_count=1)
        >>> art.present.tolist(), art.indices[:, 0].tolist()
        ([True, False, True], [0, 1, 2])
    """
    S = _finite("S", np.asarray(S, dtype=np.float64))
    if S.ndim != 2:
        raise ValueError(f"S must be a (classes, groups) matrix, got shape {S.shape}")
    if (S < 0).any():
        raise ValueError("S must be non-negative (group importances)")
    C, G = S.shape
    if isinstance(topk, bool) or not isinstance(topk, (int, np.integer)):
        raise TypeError(f"topk must be an int, got {type(topk).__name__}")
    if not 1 <= topk <= G:
        raise ValueError(f"topk must be in [1, {G}] (the number of groups), got {topk}")
    noise_sigma = _nonneg_scalar("noise_sigma", noise_sigma)
    if isinstance(quant_bits, bool) or not isinstance(quant_bits, int) or not 1 <= quant_bits <= 8:
        raise ValueError(f"quant_bits must be an int in [1, 8], got {quant_bits!r}")
    counts_arr = np.ones(C, dtype=np.int64) if counts is None else np.asarray(counts, dtype=np.int64)
    if counts_arr.shape != (C,) or (counts_arr < 0).any():
        raise ValueError(f"counts must be {C} non-negative integers, got {counts_arr.tolist()}")
    if isinstance(min_count, bool) or not isinstance(min_count, (int, np.integer)) or min_count < 0:
        raise ValueError(f"min_count must be a non-negative int, got {min_count!r}")
    # clipping: every row to unit L2 norm (sensitivity sqrt(2) per row), presence as a 0/1 indicator (1 per class)
    norms = np.linalg.norm(S, axis=1, keepdims=True)
    U = np.where(norms > 0, S / np.where(norms > 0, norms, 1.0), 1.0 / math.sqrt(G))
    h = (counts_arr >= min_count).astype(np.float64)
    if noise_sigma > 0:
        if rng is None:
            raise ValueError("rng is required when noise_sigma > 0")
        # the Gaussian mechanism on [U | h]: $$\tilde U = U + \mathcal N(0, \sigma^2 I),\ \tilde h = h + \mathcal N(0, \sigma^2 I)$$
        U = U + rng.normal(scale=noise_sigma, size=U.shape)
        h = h + rng.normal(scale=noise_sigma, size=h.shape)
    present = h > 0.5
    U = np.maximum(U, 0.0)
    # post-processing: top-k per class (ties: the smaller group index), then b-bit quantisation
    order = np.argsort(-U, axis=1, kind="stable")[:, :topk]
    kept = np.take_along_axis(U, order, axis=1)
    scale = float(kept.max()) if kept.max() > 0 else 1.0
    levels = (1 << quant_bits) - 1
    values = np.rint(kept / scale * levels).astype(np.uint8)
    scale = float(np.float32(scale))
    idx_dtype = np.uint8 if G <= 256 else np.uint16
    return SparseArtifact(order.astype(idx_dtype), values, scale, present, G, quant_bits)


def _zcdp_rho(n_classes: int, noise_sigma: float) -> float:
    """rho of one release: Delta^2 / (2 sigma^2) with Delta^2 = 3 C (``make_artifact``)."""
    return 3 * n_classes / (2 * noise_sigma**2)


def zcdp_epsilon(noise_sigma: float, n_classes: int, rounds: int, delta: float = 1e-5) -> float:
    r"""The (epsilon, delta) of a client's explanation channel over ``rounds`` releases (client-level).

    One release is the Gaussian mechanism with L2 sensitivity Delta = sqrt(3C) (map rows sqrt(2) each, presence
    bits 1 each): rho = Delta^2 / (2 sigma^2) = 3C / (2 sigma^2) zCDP; rounds add;
    $$\varepsilon = \rho_{tot} + 2\sqrt{\rho_{tot}\ln(1/\delta)}$$ (Bun & Steinke 2016, Prop. 1.3).
    ``inf`` for sigma = 0. Covers the artifacts only, not the FedAvg parameters.

    Example:
        >>> round(zcdp_epsilon(10.0, 10, 10, 1e-5), 4)    # rho = 10 * 30 / 200 = 1.5
        9.8113
    """
    noise_sigma = _nonneg_scalar("noise_sigma", noise_sigma)
    if not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1), got {delta!r}")
    if isinstance(rounds, bool) or not isinstance(rounds, (int, np.integer)) or rounds < 1:
        raise ValueError(f"rounds must be a positive int, got {rounds!r}")
    if noise_sigma == 0:
        return math.inf
    rho = rounds * _zcdp_rho(n_classes, noise_sigma)
    return rho + 2 * math.sqrt(rho * math.log(1 / delta))


def sigma_for_epsilon(epsilon: float, n_classes: int, rounds: int, delta: float = 1e-5) -> float:
    r"""The noise sigma at which ``rounds`` releases cost exactly (epsilon, delta): ``zcdp_epsilon``'s inverse.

    $$\rho_{tot} = (\sqrt{\ln(1/\delta) + \varepsilon} - \sqrt{\ln(1/\delta)})^2,\quad
      \sigma = \sqrt{3 C R / (2 \rho_{tot})}$$

    Example:
        >>> s = sigma_for_epsilon(8.0, 10, 3)
        >>> round(zcdp_epsilon(s, 10, 3), 9)
        8.0
    """
    epsilon = _nonneg_scalar("epsilon", epsilon, positive=True)
    if not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1), got {delta!r}")
    if isinstance(rounds, bool) or not isinstance(rounds, (int, np.integer)) or rounds < 1:
        raise ValueError(f"rounds must be a positive int, got {rounds!r}")
    log_inv = math.log(1 / delta)
    rho = (math.sqrt(log_inv + epsilon) - math.sqrt(log_inv)) ** 2
    return math.sqrt(3 * n_classes * rounds / (2 * rho))


# --------------------------------------------------------------------------------------------------- prior
def uniform_prior(n_classes: int, n_groups: int) -> np.ndarray:
    return np.full((n_classes, n_groups), 1.0 / n_groups)


def aggregate_prior(maps: Sequence[np.ndarray], *, present: Sequence[Sequence[bool]] | np.ndarray | None = None,
                    method: str = "median", trim: float = 0.2, prev: np.ndarray | None = None,
                    ema: float = 0.6) -> np.ndarray:
    r"""The Global Explanation Prior from clients' (C, G) simplex maps.

    Per class, over the clients that hold it: the coordinate-wise median (or trimmed mean, or mean), rows
    renormalised; then $$\Pi = \mathrm{rownorm}(e\,\Pi_{prev} + (1 - e)\,\Pi_{new})$$ when ``prev`` is given.

    Args:
        maps: one (C, G) non-negative map per client.
        present: (clients, C) booleans, whether a client's row c enters (default: all).
        method: ``"median"``, ``"trimmed_mean"`` or ``"mean"``.
        trim: fraction cut from each end by the trimmed mean, in [0, 0.5).
        prev: the previous prior (None: no smoothing).
        ema: e in [0, 1), the weight of ``prev`` (paper code: 0.6).

    Returns:
        (C, G), rows on the simplex.

    Raises:
        ValueError: shapes differ between clients, a class is held by no client, or bad settings.
    """
    if method not in AGGREGATIONS:
        raise ValueError(f"method must be one of {AGGREGATIONS}, got {method!r}")
    if len(maps) == 0:
        raise ValueError("maps must hold at least one client's map")
    stack = np.stack([np.asarray(m, dtype=np.float64) for m in maps]) if len({np.shape(m) for m in maps}) == 1 \
        else None
    if stack is None or stack.ndim != 3:
        raise ValueError(f"every client's map must have the same (classes, groups) shape, got "
                         f"{sorted({np.shape(m) for m in maps})}")
    _finite("maps", stack)
    if (stack < 0).any():
        raise ValueError("maps must be non-negative")
    N, C, G = stack.shape
    mask = np.ones((N, C), dtype=bool) if present is None else np.asarray(present, dtype=bool)
    if mask.shape != (N, C):
        raise ValueError(f"present must be (clients, classes) = {(N, C)}, got {mask.shape}")
    if not 0 <= trim < 0.5:
        raise ValueError(f"trim must be in [0, 0.5), got {trim!r}")
    if not 0 <= ema < 1:
        raise ValueError(f"ema must be in [0, 1), got {ema!r}")
    stack = normalize_rows(stack)
    out = np.empty((C, G))
    for c in range(C):
        rows = stack[mask[:, c], c, :]
        if rows.shape[0] == 0:
            raise ValueError(f"no client holds class {c}: the prior for it cannot be formed")
        if method == "median":
            # $$\Pi_{new}[c] = \mathrm{median}_i\, S_i[c]$$ (coordinate-wise)
            out[c] = np.median(rows, axis=0)
        elif method == "mean":
            out[c] = rows.mean(axis=0)
        else:
            cut = math.floor(trim * rows.shape[0])
            srt = np.sort(rows, axis=0)
            out[c] = srt[cut:rows.shape[0] - cut].mean(axis=0)
    new = normalize_rows(out)
    if prev is None:
        return new
    prev = np.asarray(prev, dtype=np.float64)
    if prev.shape != (C, G):
        raise ValueError(f"prev must be {(C, G)}, got {prev.shape}")
    # $$\Pi \leftarrow \mathrm{rownorm}(e\,\Pi + (1 - e)\,\Pi_{new})$$
    return normalize_rows(ema * prev + (1 - ema) * new)


def align(S_local: np.ndarray, prior: np.ndarray, beta: float) -> np.ndarray:
    r"""Soft alignment $$S_{mix} = \mathrm{rownorm}((1 - \beta)\,\mathrm{rownorm}(S) + \beta\,\Pi)$$.

    ``S_local`` may be (C, G) class maps with a (C, G) prior, or (n, G) per-sample maps with an (n, G) prior
    (each sample's predicted class's row).
    """
    beta = _nonneg_scalar("beta", beta)
    if beta > 1:
        raise ValueError(f"beta must be in [0, 1], got {beta}")
    S_local = _finite("S_local", np.asarray(S_local, dtype=np.float64))
    prior = _finite("prior", np.asarray(prior, dtype=np.float64))
    if S_local.shape != prior.shape:
        raise ValueError(f"S_local {S_local.shape} and prior {prior.shape} must have the same shape")
    return normalize_rows((1 - beta) * normalize_rows(np.abs(S_local)) + beta * normalize_rows(prior))


# ---------------------------------------------------------------------------------------- the algorithms
PARAM = "param/"


def client_seed(seed: int, cid: int, rnd: int, stream: int = 0) -> int:
    """A client's seed for round ``rnd`` (shuffles: stream 0; artifact noise: stream 1)."""
    return int(np.random.SeedSequence([int(seed), int(cid), int(rnd), int(stream)]).generate_state(1)[0])


def params_of(payload: dict[str, Any]) -> dict[str, np.ndarray]:
    return {k[len(PARAM):]: v for k, v in payload.items() if k.startswith(PARAM)}


def _check_client(data: Any, spec: Any) -> None:
    X = getattr(data, "X_train", None)
    if X is None:
        raise TypeError(f"client data must be a ClientData (X_train, y_train, ...), got {type(data).__name__}")
    if np.ndim(X) != 2 or np.shape(X)[1] != spec.n_features:
        raise ValueError(f"client {getattr(data, 'cid', '?')} has features of shape {np.shape(X)}, but the model "
                         f"expects {spec.n_features} (mismatched feature spaces)")
    if len(X) == 0:
        raise ValueError(f"client {getattr(data, 'cid', '?')} has no training samples")
    if not np.isfinite(X).all():
        raise ValueError(f"client {getattr(data, 'cid', '?')}: X_train contains NaN or Inf")


class FedTrain(FederatedAlgorithm):
    """FedAvg of a task model: the training every arm shares (subclasses add an explanation channel).

    Each round the server sends the global parameters; every client runs ``local_epochs`` of SGD from them on
    its own data and returns its parameters and sample count; the server averages them (``models.fedavg``,
    clients in id order). ``result(state)`` is the final server state: ``params``, ``prior`` (None here),
    ``bytes`` (per round: parameter and explanation bytes uploaded per client, and downloaded).
    """

    message_type = "train"

    def __init__(self, spec: Any, *, rounds: int = 10, lr: float = 0.05, local_epochs: int = 1,
                 batch_size: int = 32, momentum: float = 0.9, l1: float = 0.0, seed: int = 0):
        from .models import ModelSpec

        if not isinstance(spec, ModelSpec):
            raise TypeError(f"spec must be a models.ModelSpec, got {type(spec).__name__}")
        if not isinstance(rounds, int) or rounds < 1:
            raise ValueError(f"rounds must be a positive int, got {rounds!r}")
        self.spec, self.rounds = spec, rounds
        self.lr = _nonneg_scalar("lr", lr, positive=True)
        self.local_epochs, self.batch_size, self.momentum = local_epochs, batch_size, momentum
        self.l1 = _nonneg_scalar("l1", l1)
        self.seed = int(seed)

    # -- server ------------------------------------------------------------------------------------------
    def initial_state(self, client_ids: Sequence[int]) -> dict[str, Any]:
        from .models import get_params, task_model

        model = task_model(self.spec.n_features, self.spec.n_classes, hidden=self.spec.hidden, seed=self.seed)
        return {"params": get_params(model), "prior": None, "bytes": []}

    def extra_message(self, rnd: int, state: dict[str, Any]) -> dict[str, Any]:
        return {}

    def configure(self, rnd: int, state: dict[str, Any], client_ids: Sequence[int]) -> dict[int, dict[str, Any]]:
        msg = {**{PARAM + k: v for k, v in state["params"].items()}, "seed": self.seed,
               **self.extra_message(rnd, state)}
        return {cid: dict(msg) for cid in client_ids}

    def aggregate(self, rnd: int, state: dict[str, Any], replies: dict[int, dict[str, Any]]) -> dict[str, Any]:
        from .models import fedavg

        if not replies:
            raise ValueError(f"round {rnd}: no client answered")
        ordered = [replies[cid] for cid in sorted(replies)]
        params = fedavg([params_of(r) for r in ordered], [float(r["num_examples"]) for r in ordered])
        param_bytes = sum(v.nbytes for v in params.values())
        new = {**state, "params": params}
        new = self.aggregate_explanations(rnd, new, ordered)
        download = param_bytes + (0 if new.get("prior") is None or not self.sends_prior else
                                  4 * new["prior"].size)
        new["bytes"] = [*state["bytes"], {"round": rnd, "clients": len(ordered), "params_up": param_bytes,
                                          "explain_up": float(np.mean([self.explain_bytes(r) for r in ordered])),
                                          "download": download}]
        return new

    sends_prior = False

    def aggregate_explanations(self, rnd: int, state: dict[str, Any], replies: list[dict[str, Any]]
                               ) -> dict[str, Any]:
        return state

    def explain_bytes(self, reply: dict[str, Any]) -> int:
        """Bytes of a reply's explanation channel (0 for plain FedAvg)."""
        return 0

    # -- client ------------------------------------------------------------------------------------------
    def client_step(self, data: Any, message: dict[str, Any], state: dict[str, Any], rnd: int
                    ) -> tuple[dict[str, Any], dict[str, Any]]:
        from .models import local_sgd

        _check_client(data, self.spec)
        seed = int(message["seed"])
        params = local_sgd(params_of(message), data.X_train, data.y_train, spec=self.spec, lr=self.lr,
                           epochs=self.local_epochs, batch_size=self.batch_size, momentum=self.momentum,
                           l1=self.l1, seed=client_seed(seed, data.cid, rnd, 0))
        reply = {**{PARAM + k: v for k, v in params.items()}, "num_examples": len(data.y_train)}
        reply.update(self.explain(data, params, message, rnd))
        return reply, state

    def explain(self, data: Any, params: dict[str, np.ndarray], message: dict[str, Any], rnd: int
                ) -> dict[str, Any]:
        """The client's explanation payload (none for plain FedAvg)."""
        return {}


class XFedAlign(FedTrain):
    r"""xFedAlign: FedAvg for the task model, surrogate artifacts and a robust Global Explanation Prior beside it.

    Client (each round, after local SGD): distil a sparse linear surrogate from its updated model on its own
    training data (``distill_surrogate``), send the private top-k artifact of its group map and its noised
    class-presence bits (``make_artifact``). Server: FedAvg of the parameters (untouched by the explanations), the prior
    $$\Pi \leftarrow \mathrm{rownorm}(e\,\Pi + (1 - e)\,\mathrm{median}_i S_i)$$ over the clients holding each
    class (Pi starts uniform), sent back with beta for the clients' soft alignment (``align``).

    Args:
        spec: the task model (``models.ModelSpec``).
        groups: the feature groups (``data.GroupSpec``).
        rounds, lr, local_epochs, batch_size, momentum, seed: FedAvg settings (see ``FedTrain``).
        topk: k groups per class in an artifact (1 <= k <= G).
        noise_sigma: Gaussian noise on the unit-norm rows (>= 0; ``zcdp_epsilon`` gives its guarantee).
        quant_bits: bits per artifact value.
        temperature, surrogate_l1, surrogate_iters: surrogate distillation (``distill_surrogate``).
        aggregation: ``"median"`` (paper), ``"trimmed_mean"`` or ``"mean"``.
        trim: trimmed-mean fraction.
        ema: e, the weight of the previous prior (paper code: 0.6); 0 disables smoothing.
        beta: the alignment weight sent to clients (paper code: 0.35 on MNIST).
        min_class_count: a client's row c enters the prior only if it holds this many samples of class c (sent
            as a noised presence bit; a class no client reports takes every client's row).

    Example:
        >>> from icml26.common.federation import run_in_process
        >>> from icml26.xfedalign.data import load_task
        >>> from icml26.xfedalign.models import ModelSpec
        >>> task = load_task("cancer", "iid", n_clients=3, seed=0)
        >>> algo = XFedAlign(ModelSpec(30, 2, 16), task.groups, rounds=2, topk=4, lr=0.05)
        >>> out = run_in_process(algo, task.clients)
        >>> out["prior"].shape, out["bytes"][-1]["explain_up"]
        ((2, 10), 29.0)
    """

    sends_prior = True

    def __init__(self, spec: Any, groups: Any, *, topk: int = 8, noise_sigma: float = 0.1, quant_bits: int = 8,
                 temperature: float = 3.0, surrogate_l1: float = 1e-3, surrogate_iters: int = 100,
                 aggregation: str = "median", trim: float = 0.2, ema: float = 0.6, beta: float = 0.35,
                 min_class_count: int = 1, **fedavg: Any):
        super().__init__(spec, **fedavg)
        if groups.n_features != spec.n_features:
            raise ValueError(f"the groups cover {groups.n_features} features but the model has {spec.n_features} "
                             "(mismatched feature spaces)")
        if isinstance(topk, bool) or not isinstance(topk, int):
            raise TypeError(f"topk must be an int, got {type(topk).__name__}")
        if not 1 <= topk <= groups.n_groups:
            raise ValueError(f"topk must be in [1, {groups.n_groups}] (the number of groups), got {topk}")
        if aggregation not in AGGREGATIONS:
            raise ValueError(f"aggregation must be one of {AGGREGATIONS}, got {aggregation!r}")
        self.groups, self.topk = groups, topk
        self.noise_sigma = _nonneg_scalar("noise_sigma", noise_sigma)
        self.quant_bits, self.temperature = quant_bits, _nonneg_scalar("temperature", temperature, positive=True)
        self.surrogate_l1, self.surrogate_iters = _nonneg_scalar("surrogate_l1", surrogate_l1), surrogate_iters
        self.aggregation, self.trim, self.ema = aggregation, trim, ema
        self.beta = _nonneg_scalar("beta", beta)
        if self.beta > 1:
            raise ValueError(f"beta must be in [0, 1], got {beta}")
        self.min_class_count = min_class_count
        self._membership = groups.matrix()

    def initial_state(self, client_ids: Sequence[int]) -> dict[str, Any]:
        state = super().initial_state(client_ids)
        state["prior"] = uniform_prior(self.spec.n_classes, self.groups.n_groups)
        return state

    def extra_message(self, rnd: int, state: dict[str, Any]) -> dict[str, Any]:
        return {"prior": np.asarray(state["prior"], dtype=np.float32), "beta": self.beta}

    def explain(self, data: Any, params: dict[str, np.ndarray], message: dict[str, Any], rnd: int
                ) -> dict[str, Any]:
        from .models import predict_logits

        # the teacher is the client's updated task model, on its own training data
        logits = predict_logits(self.spec, params, data.X_train)
        surrogate = distill_surrogate(logits, data.X_train, temperature=self.temperature, l1=self.surrogate_l1,
                                      iters=self.surrogate_iters)
        counts = np.bincount(np.asarray(data.y_train), minlength=self.spec.n_classes)
        rng = np.random.default_rng(client_seed(int(message["seed"]), data.cid, rnd, 1))
        art = make_artifact(surrogate.group_map(self._membership), self.topk, noise_sigma=self.noise_sigma,
                            quant_bits=self.quant_bits, rng=rng, counts=counts, min_count=self.min_class_count)
        return art.to_payload()

    def explain_bytes(self, reply: dict[str, Any]) -> int:
        return SparseArtifact.from_payload(reply).nbytes

    def aggregate_explanations(self, rnd: int, state: dict[str, Any], replies: list[dict[str, Any]]
                               ) -> dict[str, Any]:
        arts = [SparseArtifact.from_payload(r) for r in replies]
        shapes = {(a.n_classes, a.n_groups) for a in arts}
        if shapes != {(self.spec.n_classes, self.groups.n_groups)}:
            raise ValueError(f"round {rnd}: artifacts of shapes {sorted(shapes)}, expected "
                             f"{(self.spec.n_classes, self.groups.n_groups)} (mismatched feature spaces)")
        present = np.array([a.present for a in arts], dtype=bool)
        # a class no client reports (its bits lost to noise) takes every client's row: post-processing only
        present[:, ~present.any(axis=0)] = True
        prior = aggregate_prior([a.dense() for a in arts], present=present,
                                method=self.aggregation, trim=self.trim,
                                prev=state["prior"] if self.ema > 0 else None, ema=self.ema)
        return {**state, "prior": prior}
