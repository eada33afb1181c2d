"""AdamW-style Shampoo as a ``torch.optim.Optimizer``, with its pure per-parameter update function above it.

For a matrix parameter X in R^{m x n} (conv weights are reshaped to (out, in*kh*kw)) at step k:

    G_k = grad f(X_k)
    M_k = b1 M_{k-1} + (1 - b1) G_k                          first moment (EMA)
    L_k = b2 L_{k-1} + (1 - b2) G_k G_k^T                    left Kronecker factor
    R_k = b2 R_{k-1} + (1 - b2) G_k^T G_k                    right Kronecker factor
    D_k = (L^_k + eps I)^(-1/(2p)) M^_k (R^_k + eps I)^(-1/(2q)),   1/p + 1/q = 1
    X_{k+1} = (1 - lr wd) X_k - lr D_k

with bias-corrected M^ = M / (1 - b1^k), L^ = L / (1 - b2^k), R^ = R / (1 - b2^k) (Li, Dong & Lin 2026;
practical choices from Meta's Distributed Shampoo). ``exponents = (1/(2p), 1/(2q))``: ``(1/4, 1/4)`` is
two-sided (classical) Shampoo, ``(1/2, 0)`` one-sided L^(-1/2) M, ``(0, 1/2)`` one-sided M R^(-1/2).

Practical Shampoo on top of the paper's rule (all optional, Meta's step order):

- inverse roots are recomputed every ``precondition_frequency`` steps from step ``start_preconditioning_step``
  on, by a symmetric eigendecomposition of the factor plus eps I (eigenvalues clamped at eps), in the moments'
  precision by default (float32 with a float64 retry; float64 for float64 parameters: ``root_dtype``), or by
  the coupled Newton iteration (``root_method="newton"``, matrix products only, eigh where it does not converge);
- every block of one shape, across parameters, is stacked: factor updates, roots and preconditioning products
  are batched calls, per-block decisions are device masks, and only a root computation reads from the device;
- speed options: factors updated every ``statistics_frequency`` = s steps with weight b2^s (s = 1 is the rule
  above), the finiteness pass over the gradients optional (``check_finite``), ``exponents="smaller"`` for
  one-sided preconditioning on each matrix's smaller side;
- Adam grafting (``grafting="adam"``): the Shampoo direction is rescaled per block to the Frobenius norm of
  the Adam direction M^ / (sqrt(V^) + graft_eps), V the EMA of G^2; before preconditioning starts the step
  is the Adam step itself, so the optimizer is exactly AdamW until then;
- dimensions above ``max_preconditioner_dim`` are split into blocks, each with its own factors;
- 1-D and scalar parameters (biases, norms) take the grafting method's step (Adam for ``"adam"`` and
  ``"none"``, momentum SGD for ``"sgd"``), as does a block whose root is not available: a factor that fails to
  decompose keeps its last good root, or falls back to the grafted step with a warning, never NaN.

Example:
    >>> import torch
    >>> from icml26.shampoo import Shampoo
    >>> torch.manual_seed(0)  # doctest: +ELLIPSIS
    <torch._C.Generator object at ...>
    >>> model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    >>> opt = Shampoo(model.parameters(), lr=1e-2, precondition_frequency=5)
    >>> x, y = torch.randn(64, 8), torch.randn(64, 2)
    >>> for _ in range(20):
    ...     opt.zero_grad()
    ...     loss = torch.nn.functional.mse_loss(model(x), y)
    ...     loss.backward()
    ...     opt.step()
    >>> bool(loss < 1.5)
    True

Reference: H. Li, Y. Dong, Z. Lin, "Convergence Rate Analysis of the AdamW-style Shampoo: Unifying One-sided
and Two-Sided Preconditioning", ICML 2026, arXiv:2601.07326. Practical Shampoo: H.-J. M. Shi et al., "A
Distributed Data-Parallel PyTorch Implementation of the Distributed Shampoo Optimizer", arXiv:2309.06497.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import itertools
import math
import warnings
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import Tensor

EXPONENT_PRESETS: dict[str, tuple[float, float]] = {
    "two_sided": (0.25, 0.25),
    "left": (0.5, 0.0),
    "right": (0.0, 0.5),
}
#: one-sided on each parameter's smaller side: L^(-1/2) M when m <= n, else M R^(-1/2) (cheapest roots)
SMALLER_SIDE = "smaller"
ROOT_DTYPES = ("auto", torch.float32, torch.float64)
GRAFTINGS = ("adam", "sgd", "none")
#: how inverse roots are computed: a batched symmetric eigendecomposition, or the coupled Newton iteration
#: (matrix products only; exponents 1/p for integer p), which falls back to the eigendecomposition per block
ROOT_METHODS = ("eigh", "newton")


def resolve_exponents(exponents: tuple[float, float] | str) -> tuple[float, float] | str:
    """``(e_left, e_right)`` from a preset name or a pair (``"smaller"`` is kept: it is resolved per parameter);
    warns when they do not sum to 1/2.

    Args:
        exponents: ``"two_sided"``, ``"left"``, ``"right"``, ``"smaller"`` or ``(1/(2p), 1/(2q))``.
    """
    if isinstance(exponents, str):
        if exponents == SMALLER_SIDE:
            return SMALLER_SIDE
        if exponents not in EXPONENT_PRESETS:
            raise ValueError(
                f"exponents must be one of {sorted([*EXPONENT_PRESETS, SMALLER_SIDE])} or a pair, "
                f"got {exponents!r}"
            )
        return EXPONENT_PRESETS[exponents]
    try:
        e_left, e_right = (float(e) for e in exponents)
    except (TypeError, ValueError):
        raise TypeError(f"exponents must be a preset name or a pair of floats, got {exponents!r}") from None
    if (
        not (math.isfinite(e_left) and math.isfinite(e_right))
        or e_left < 0
        or e_right < 0
        or e_left + e_right == 0
    ):
        raise ValueError(f"exponents must be finite, >= 0 and not both 0, got {exponents!r}")
    if not math.isclose(e_left + e_right, 0.5, abs_tol=1e-12):
        warnings.warn(
            f"exponents {exponents!r} sum to {e_left + e_right:g}, not 1/2 (1/p + 1/q = 1); the paper's rate "
            "is for exponents summing to 1/2",
            UserWarning,
            stacklevel=3,
        )
    return e_left, e_right


def param_exponents(
    exponents: tuple[float, float] | str, shape: tuple[int, int] | None
) -> tuple[float, float]:
    """The exponent pair for one parameter: ``"smaller"`` becomes (1/2, 0) when m <= n, else (0, 1/2)."""
    if exponents != SMALLER_SIDE:
        return exponents  # type: ignore[return-value]
    if shape is None or shape[0] <= shape[1]:
        return EXPONENT_PRESETS["left"]
    return EXPONENT_PRESETS["right"]


def matrix_shape(param: Tensor) -> tuple[int, int] | None:
    """The 2-D shape Shampoo preconditions: ``(d0, d1*d2*...)`` for >= 2-D tensors, ``None`` for 0-/1-D."""
    if param.ndim < 2:
        return None
    return param.shape[0], math.prod(param.shape[1:])


@functools.lru_cache(maxsize=1024)
def block_slices(shape: tuple[int, int], max_dim: int) -> tuple[tuple[slice, slice], ...]:
    """Row/column slices that split ``shape`` into blocks no larger than ``max_dim`` on either side."""
    m, n = shape
    rows = [slice(i, min(i + max_dim, m)) for i in range(0, m, max_dim)]
    cols = [slice(j, min(j + max_dim, n)) for j in range(0, n, max_dim)]
    return tuple((r, c) for r in rows for c in cols)


#: coupled Newton iterations per root computation (``root_method="newton"``): a fixed count, so the batch never
#: waits on the host; enough for condition numbers of (L^ + eps I) up to about 1e10 (README, Newton roots)
NEWTON_ITERATIONS = 40
#: a Newton root is accepted when max |M_K - I| <= NEWTON_TOLERANCE_ULPS * (unit roundoff of its dtype), M_K the
#: coupled iterate X_K^p (A + eps I); otherwise the block falls back to the eigendecomposition root
NEWTON_TOLERANCE_ULPS = 1000.0


def matrix_inverse_root(
    factor: Tensor, exponent: float, eps: float, dtype: torch.dtype = torch.float64
) -> Tensor:
    """``(A + eps I)^(-exponent)`` of a symmetric PSD matrix by eigendecomposition in ``dtype``.

    The factor is symmetrised, ``eps I`` added, and eigenvalues below ``eps`` (round-off) clamped to ``eps``.
    With ``dtype=torch.float32`` a decomposition that fails or returns non-finite values is retried in float64
    (Meta's ``EigenConfig(retry_double_precision=True)``). One matrix, for users and tests; the optimizer
    computes the roots of all its factors of a size in one batched call of the same code (``_batched_roots``).

    Raises:
        ValueError: the factor has NaN/Inf entries.
        torch.linalg.LinAlgError: the eigendecomposition did not converge (in float64).
    """
    attempts = [dtype] if dtype == torch.float64 else [dtype, torch.float64]
    for i, dt in enumerate(attempts):
        last = i == len(attempts) - 1
        try:
            root, finite, ok = _batched_roots(factor.unsqueeze(0), exponent, eps, dt, "eigh")
        except torch.linalg.LinAlgError:
            if last:
                raise
            continue
        if not bool(finite[0]):
            raise ValueError("the Kronecker factor has non-finite entries")
        if bool(ok[0]) or last:
            return root[0]
    raise AssertionError("unreachable")  # pragma: no cover


def _newton_order(exponent: float) -> int | None:
    """``p`` with ``exponent = 1/p`` (the coupled Newton iteration computes A^(-1/p) for integer p), else None."""
    if exponent <= 0:
        return None
    p = round(1.0 / exponent)
    return p if p >= 1 and math.isclose(1.0 / exponent, p, rel_tol=1e-9) else None


def _all_finite(batch: Tensor) -> Tensor:
    """Per matrix of ``[B, d, d]``: are all its entries finite? (The largest magnitude is finite exactly when they
    are: ``amax`` propagates NaN, and unlike a sum it cannot overflow on finite entries.)"""
    return torch.isfinite(batch.abs().amax(dim=(-2, -1)))


def _prepare(factors: Tensor, eps: float, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """``(A + A^T)/2 + eps I`` for a batch in ``dtype``, with non-finite matrices replaced by I, and the mask of
    the finite ones (decided on the device: nothing is read back)."""
    a = factors.to(dtype)
    finite = _all_finite(a)
    a = 0.5 * (a + a.mT)
    a.masked_fill_(~finite.view(-1, 1, 1), 0.0)  # a non-finite factor becomes eps I (its root is discarded)
    a.diagonal(dim1=-2, dim2=-1).add_(eps)
    return a, finite


def _eigh_roots(a: Tensor, exponent: float, eps: float) -> Tensor:
    """``Q diag(max(lambda, eps)^(-e)) Q^T`` for a batch (one ``eigh`` call; raises ``LinAlgError``)."""
    # $$(A + \epsilon I)^{-e} = Q \, \mathrm{diag}(\lambda^{-e}) \, Q^\top$$
    eigenvalues, eigenvectors = torch.linalg.eigh(a)
    # the power is taken row by row (a padded, strided view): a transcendental's vectorised and scalar paths
    # then split each row as they split one matrix's eigenvalues, so a batch gives one matrix's bits
    padded = torch.nn.functional.pad(eigenvalues, (0, 1))
    padded.clamp_min_(eps)
    scale = padded[:, :-1].pow(-exponent)
    return torch.bmm(eigenvectors * scale.unsqueeze(-2), eigenvectors.mT)


def _newton_roots(a: Tensor, p: int) -> tuple[Tensor, Tensor]:
    """Coupled Newton iteration for ``a^(-1/p)`` of a batch of SPD matrices, matrix products only.

    X_0 = z^(1/p) I, M_0 = z A with z = (p + 1) / (2 ||A||_F); then M_p = ((p + 1) I - M) / p, X <- X M_p,
    M <- M_p^p M, so that M_k = X_k^p A throughout and M_k -> I, X_k -> A^(-1/p) (Guo & Higham 2006; Meta's
    ``CoupledNewtonConfig``). ``NEWTON_ITERATIONS`` steps, no early exit (no host read); returns the roots and
    the residuals max |M_K - I| per matrix.
    """
    eye = torch.eye(a.shape[-1], dtype=a.dtype, device=a.device)
    z = (p + 1) / (2.0 * torch.linalg.matrix_norm(a))
    x = eye * z.pow(1.0 / p)[:, None, None]
    m = a * z[:, None, None]
    for _ in range(NEWTON_ITERATIONS):
        # $$M_p = \tfrac{(p + 1) I - M}{p}, \quad X \leftarrow X M_p, \quad M \leftarrow M_p^p M$$
        mp = torch.add(eye * ((p + 1.0) / p), m, alpha=-1.0 / p)
        x = torch.bmm(x, mp)
        m = torch.bmm(torch.linalg.matrix_power(mp, p), m)
    residual = (m - eye).abs().flatten(1).amax(1)
    return 0.5 * (x + x.mT), residual


def _batched_roots(
    factors: Tensor, exponent: float, eps: float, dtype: torch.dtype, method: str
) -> tuple[Tensor, Tensor, Tensor]:
    """Inverse roots of a batch of bias-corrected factors ``[B, d, d]`` in ``dtype``.

    Returns ``(roots, finite, ok)``: ``finite[b]`` whether factor b was finite (else its root is meaningless),
    ``ok[b]`` whether its root is usable (finite, and for Newton within tolerance). All on the device.
    ``method="eigh"`` raises ``LinAlgError`` when the batched decomposition fails (the caller retries per matrix).
    """
    a, finite = _prepare(factors, eps, dtype)
    if method == "newton":
        roots, residual = _newton_roots(a, _newton_order(exponent))  # type: ignore[arg-type]
        tolerance = NEWTON_TOLERANCE_ULPS * torch.finfo(dtype).eps
        # a residual above tolerance (or NaN) marks the root unusable: the caller takes the eigh root instead
        ok = finite & (residual <= tolerance)
    else:
        roots = _eigh_roots(a, exponent, eps)
        ok = finite
    return roots, finite, ok & _all_finite(roots)


def _batched_roots_or_each(
    factors: Tensor, exponent: float, eps: float, dtype: torch.dtype, method: str
) -> tuple[Tensor, Tensor, Tensor]:
    """``_batched_roots``; when the batched ``eigh`` fails to converge, each matrix alone (the rare path), a
    failing one getting identity and ``ok = False``."""
    with _full_precision_matmuls():
        try:
            return _batched_roots(factors, exponent, eps, dtype, method)
        except torch.linalg.LinAlgError:
            pass
        roots, finites, oks = [], [], []
        for b in range(factors.shape[0]):
            try:
                r, f, o = _batched_roots(factors[b : b + 1], exponent, eps, dtype, method)
            except torch.linalg.LinAlgError:
                d = factors.shape[-1]
                r = torch.eye(d, dtype=dtype, device=factors.device).unsqueeze(0)
                f = _all_finite(factors[b : b + 1])
                o = torch.zeros(1, dtype=torch.bool, device=factors.device)
            roots.append(r)
            finites.append(f)
            oks.append(o)
        return torch.cat(roots), torch.cat(finites), torch.cat(oks)


class _full_precision_matmuls:
    """Root computations in full float32 precision whatever the user set for the model (TF32 on GPUs would
    leave a Newton iteration or the eigenvector product with 10-bit mantissas)."""

    def __enter__(self) -> None:
        self.saved = torch.get_float32_matmul_precision()
        if self.saved != "highest":
            torch.set_float32_matmul_precision("highest")

    def __exit__(self, *exc: object) -> None:
        if self.saved != "highest":
            torch.set_float32_matmul_precision(self.saved)


def _root_attempts(method: str, dtype: torch.dtype) -> list[tuple[str, torch.dtype]]:
    """The first attempt and its fallbacks: Newton falls back to eigh, float32 eigh to float64 eigh."""
    attempts = [(method, dtype)]
    if method == "newton":
        attempts.append(("eigh", dtype))
    if dtype != torch.float64:
        attempts.append(("eigh", torch.float64))
    return attempts


def init_state(
    param: Tensor,
    state: dict[str, Any],
    *,
    exponents: tuple[float, float],
    max_preconditioner_dim: int,
    factor_dtype: torch.dtype,
) -> None:
    """Create the per-parameter state: moments, and per block the factors and their inverse roots.

    Each block's tensors are separate here; the first step stacks every block of a shape into one tensor per
    kind (``_Layout``) and the state's lists then hold views of those stacks (same values, same state dict).
    """
    work = torch.float64 if param.dtype == torch.float64 else torch.float32
    state["step"] = 0
    state["exp_avg"] = torch.zeros(param.shape, dtype=work, device=param.device)
    state["exp_avg_sq"] = torch.zeros(param.shape, dtype=work, device=param.device)
    shape = matrix_shape(param)
    if shape is None:
        return
    root_dtype = work  # roots are stored in the moments' dtype
    blocks = block_slices(shape, max_preconditioner_dim)
    e_left, e_right = exponents
    state["left"], state["right"], state["left_root"], state["right_root"] = [], [], [], []
    for rows, cols in blocks:
        mb, nb = rows.stop - rows.start, cols.stop - cols.start
        if e_left > 0:
            state["left"].append(torch.zeros(mb, mb, dtype=factor_dtype, device=param.device))
            state["left_root"].append(torch.eye(mb, dtype=root_dtype, device=param.device))
        if e_right > 0:
            state["right"].append(torch.zeros(nb, nb, dtype=factor_dtype, device=param.device))
            state["right_root"].append(torch.eye(nb, dtype=root_dtype, device=param.device))
    state["root_ready"] = [False] * len(blocks)
    state["root_failures"] = 0


# ------------------------------------------------------------------------------------------- stacked blocks
_SIDES = ("left", "right", "left_root", "right_root")


def _spans(size: int, max_dim: int) -> list[tuple[int, int, int]]:
    """``(start, count, block size)`` runs of equal blocks along one side, in ``block_slices``' order."""
    if size <= max_dim:
        return [(0, 1, size)]
    full = size // max_dim
    runs = [(0, full, max_dim)]
    if size > full * max_dim:
        runs.append((full * max_dim, 1, size - full * max_dim))
    return runs


@dataclasses.dataclass(eq=False)
class _Param:
    """One matrix parameter in a layout: its state, exponents and the lists of views it was given."""

    param: Tensor
    state: dict[str, Any]
    shape: tuple[int, int]
    exponents: tuple[float, float]
    lists: dict[str, list[Tensor]]
    sources: list[_Source] = dataclasses.field(default_factory=list)

    def owns_state(self) -> bool:
        st, lists = self.state, self.lists
        return (
            st.get("left") is lists["left"]
            and st.get("right") is lists["right"]
            and st.get("left_root") is lists["left_root"]
            and st.get("right_root") is lists["right_root"]
        )


@dataclasses.dataclass(eq=False)
class _Source:
    """A rectangle of one parameter's matrix tiled by ``nr x nc`` equal blocks: entries ``start:start+nr*nc``
    of its group, in ``block_slices``' (row-major) order."""

    info: _Param
    r0: int
    c0: int
    nr: int
    nc: int
    mb: int
    nb: int
    start: int
    first_block: tuple[int, int]  # (row block, column block) of its first block

    def __post_init__(self) -> None:
        self.count = self.nr * self.nc
        #: the source is the parameter's whole matrix (one block)
        self.whole = self.count == 1 and (self.mb, self.nb) == self.info.shape

    def _rect(self, x: Tensor) -> Tensor:
        x2 = x.reshape(self.info.shape)
        return x2[self.r0 : self.r0 + self.nr * self.mb, self.c0 : self.c0 + self.nc * self.nb]

    def take(self, x: Tensor) -> Tensor:
        """The blocks of ``x`` (a parameter-shaped tensor) in this rectangle as ``[nr*nc, mb, nb]`` (a view when
        possible)."""
        if self.whole:
            return x.reshape(1, self.mb, self.nb)
        v = self._rect(x)
        if self.count == 1:
            return v.unsqueeze(0)
        return v.reshape(self.nr, self.mb, self.nc, self.nb).transpose(1, 2).reshape(-1, self.mb, self.nb)

    def norms(self, x: Tensor) -> Tensor:
        """The Frobenius norms ``[nr*nc]`` of the blocks of ``x`` in this rectangle, without gathering them."""
        if self.whole:
            return torch.linalg.vector_norm(x.reshape(1, self.mb, self.nb), dim=(-2, -1))
        v = self._rect(x).reshape(self.nr, self.mb, self.nc, self.nb)
        return torch.linalg.vector_norm(v, dim=(1, 3)).flatten()

    def put(self, out2: Tensor, blocks: Tensor) -> None:
        """Write ``[nr*nc, mb, nb]`` blocks back into their rectangle of the 2-D ``out2``."""
        v = out2[self.r0 : self.r0 + self.nr * self.mb, self.c0 : self.c0 + self.nc * self.nb]
        v.view(self.nr, self.mb, self.nc, self.nb).copy_(
            blocks.view(self.nr, self.nc, self.mb, self.nb).transpose(1, 2)
        )


class _Group:
    """Every block of one shape (and exponents, dtypes, device) in a param group: factors and roots stacked."""

    def __init__(self, mb: int, nb: int, exponents: tuple[float, float], root_dtype: torch.dtype):
        self.mb, self.nb = mb, nb
        self.e_left, self.e_right = exponents
        self.root_dtype = root_dtype  # the stored roots' dtype (the moments')
        self.sources: list[_Source] = []
        self.n = 0
        self.entry_blocks: list[tuple[_Param, int]] = []  # per entry: its parameter and block index
        self.all_whole = True  # every source is a whole parameter (one block each)
        self.bufs: dict[str, Tensor | None] = {}
        self._index_cache: dict[tuple[int, ...], Tensor] = {}
        self._mask_cache: dict[tuple[bool, ...], Tensor] = {}

    def add(
        self, info: _Param, r0: int, c0: int, nr: int, nc: int, first: tuple[int, int], ncols: int
    ) -> None:
        src = _Source(info, r0, c0, nr, nc, self.mb, self.nb, self.n, first)
        self.all_whole = self.all_whole and src.whole
        self.sources.append(src)
        info.sources.append(src)
        for i in range(nr):
            for j in range(nc):
                self.entry_blocks.append((info, (first[0] + i) * ncols + first[1] + j))
        self.n += nr * nc

    def allocate(self) -> None:
        """Stack the blocks' state tensors into one tensor per kind and hand each block a view of its row."""
        self.all_rows = list(range(self.n))
        for kind in _SIDES:
            tensors = [info.state[kind][b] for info, b in self.entry_blocks if info.state[kind]]
            if not tensors:
                self.bufs[kind] = None
                continue
            buf = torch.stack(tensors)
            self.bufs[kind] = buf
            for (info, b), view in zip(self.entry_blocks, buf.unbind(0), strict=True):
                info.lists[kind][b] = view

    def entries(self, sources: list[_Source]) -> tuple[Tensor | None, list[int]]:
        """The entry rows of ``sources``: ``(None, rows)`` when they are all of the group's, else an index
        tensor (cached: made once per subset, so a step never copies indices to the device twice)."""
        if sources is self.sources:
            return None, self.all_rows
        rows = [e for s in sources for e in range(s.start, s.start + s.count)]
        if len(rows) == self.n:
            return None, rows
        key = tuple(rows)
        if key not in self._index_cache:
            self._index_cache[key] = _device_tensor(rows, torch.long, self._device())
        return self._index_cache[key], rows

    def mask(self, flags: list[bool]) -> Tensor:
        key = tuple(flags)
        if key not in self._mask_cache:
            self._mask_cache[key] = _device_tensor(flags, torch.bool, self._device())
        return self._mask_cache[key]

    def _device(self) -> torch.device:
        return self.sources[0].info.param.device


class _Layout:
    """The blocks of a param group's matrix parameters grouped by shape, each group's state stacked.

    Built on the first step (and again when parameters join or a state dict is loaded); per step the work is
    a fixed number of batched calls per group (``baddbmm``, ``bmm``, norms), however many blocks it holds.
    """

    def __init__(self, entries: list[tuple[Tensor, dict[str, Any], tuple[float, float]]], max_dim: int):
        self.params: dict[int, _Param] = {}
        groups: dict[tuple, _Group] = {}
        for p, st, exps in entries:
            shape = matrix_shape(p)
            n_blocks = len(st["root_ready"])
            info = _Param(p, st, shape, exps, {k: [None] * len(st[k]) for k in _SIDES})  # type: ignore[arg-type]
            self.params[id(p)] = info
            factor = (st["left"] or st["right"])[0]
            root = (st["left_root"] or st["right_root"])[0]
            row_runs, col_runs = _spans(shape[0], max_dim), _spans(shape[1], max_dim)
            ncols = sum(c for _, c, _ in col_runs)
            if n_blocks != sum(c for _, c, _ in row_runs) * ncols:
                raise ValueError(
                    f"the state of a parameter of shape {tuple(p.shape)} holds {n_blocks} blocks, not those of "
                    f"max_preconditioner_dim={max_dim}"
                )
            for r0, nr, mb in row_runs:
                for c0, nc, nb in col_runs:
                    key = (mb, nb, exps, factor.dtype, root.dtype, p.device)
                    if key not in groups:
                        groups[key] = _Group(mb, nb, exps, root.dtype)
                    groups[key].add(info, r0, c0, nr, nc, (r0 // max_dim, c0 // max_dim), ncols)
        self.groups = list(groups.values())
        for g in self.groups:
            g.allocate()
        for info in self.params.values():
            for k in _SIDES:
                info.state[k] = info.lists[k]

    def owns(self, p: Tensor, st: dict[str, Any]) -> bool:
        info = self.params.get(id(p))
        return info is not None and info.param is p and info.state is st and info.owns_state()


def _device_tensor(values: list, dtype: torch.dtype, device: torch.device) -> Tensor:
    """A small host list on the device without a stream synchronisation (pinned memory on CUDA)."""
    if device.type == "cuda":
        return torch.tensor(values, dtype=dtype, pin_memory=True).to(device, non_blocking=True)
    return torch.tensor(values, dtype=dtype, device=device)


def _get_layout(
    cache: dict[str, Any] | None,
    params: list[Tensor],
    states: list[dict[str, Any]],
    matrices: list[int],
    exponents: tuple[float, float] | str,
    max_dim: int,
) -> _Layout:
    """The cached layout when it still owns the state of every matrix parameter of the step, else a new one
    (keeping the parameters of the old one whose state it still owns, so a parameter without a gradient this
    step stays stacked)."""
    old = cache.get("layout") if cache is not None else None
    fits = old is not None and cache.get("max_dim") == max_dim  # type: ignore[union-attr]
    if fits and all(old.owns(params[i], states[i]) for i in matrices):  # type: ignore[union-attr]
        return old  # type: ignore[return-value]
    entries = [(params[i], states[i], param_exponents(exponents, matrix_shape(params[i]))) for i in matrices]
    if fits:
        seen = {id(p) for p, _, _ in entries}
        entries += [
            (i.param, i.state, i.exponents)
            for i in old.params.values()  # type: ignore[union-attr]
            if id(i.param) not in seen and old.owns(i.param, i.state)  # type: ignore[union-attr]
        ]
    layout = _Layout(entries, max_dim)
    if cache is not None:
        cache["layout"], cache["max_dim"] = layout, max_dim
    return layout


def _gather(blocks: list[Tensor]) -> Tensor:
    """One ``[B, mb, nb]`` tensor of the blocks, contiguous (so a block's products do not depend on which other
    blocks share its batch: BLAS results can depend on the operands' strides)."""
    return blocks[0].contiguous() if len(blocks) == 1 else torch.cat(blocks)


def _rows(buf: Tensor, index: Tensor | None) -> Tensor:
    return buf if index is None else buf.index_select(0, index)


def _baddbmm_rows(
    buf: Tensor, index: Tensor | None, a: Tensor, b: Tensor, *, beta: float, alpha: float
) -> None:
    """``buf[rows] = beta buf[rows] + alpha a b`` (in place on the whole stack when ``index`` is None)."""
    if index is None:
        buf.baddbmm_(a, b, beta=beta, alpha=alpha)
    else:
        buf.index_copy_(0, index, buf.index_select(0, index).baddbmm_(a, b, beta=beta, alpha=alpha))


def _write_rows_where(buf: Tensor, index: Tensor | None, ok: Tensor, new: Tensor) -> None:
    """``buf[rows] = where(ok, new, buf[rows])`` per matrix: a row takes its new value only where ``ok``."""
    if index is None:
        torch.where(ok.view(-1, 1, 1), new, buf, out=buf)
    else:
        buf.index_copy_(0, index, torch.where(ok.view(-1, 1, 1), new, buf.index_select(0, index)))


@dataclasses.dataclass(eq=False)
class _RootPart:
    group: _Group
    side: str  # "left" or "right"
    index: Tensor | None
    rows: list[int]
    bias2: list[float]
    offset: int = 0


def _refresh_roots(
    layout: _Layout,
    due: dict[int, float],
    *,
    eps: float,
    root_dtype: torch.dtype | str,
    root_method: str,
) -> int:
    """Recompute the inverse roots of every block of the parameters in ``due`` (``id(param) -> 1 - b2^k``).

    All factors of one size, exponent and precision go through one batched root computation; every check
    (finite factor, finite root, Newton residual) is a device mask, and a block takes its new roots through
    ``torch.where`` (a failing block keeps both of its old ones). One host read per call fetches all the
    masks, for ``root_ready``, the failure count and any retry (float32 -> float64, Newton -> eigh), which
    only a failing root starts. Returns how many blocks failed to decompose.
    """
    batches: dict[tuple[int, torch.dtype, float], list[_RootPart]] = {}
    selected: list[tuple[_Group, Tensor | None, list[int]]] = []
    for g in layout.groups:
        sources = [s for s in g.sources if id(s.info.param) in due]
        if not sources:
            continue
        index, rows = g.entries(sources)
        selected.append((g, index, rows))
        bias2 = [due[id(g.entry_blocks[r][0].param)] for r in rows]
        dtype = g.root_dtype if root_dtype == "auto" else root_dtype
        for side, e, d in (("left", g.e_left, g.mb), ("right", g.e_right, g.nb)):
            if e > 0:
                batches.setdefault((d, dtype, e), []).append(_RootPart(g, side, index, rows, bias2))
    if not batches:
        return 0

    results: dict[tuple, list] = {}
    for key, parts in batches.items():
        d, dtype, exponent = key
        offset = 0
        for part in parts:
            part.offset, offset = offset, offset + len(part.rows)
        factors = _gather([_rows(part.group.bufs[part.side], part.index) for part in parts])
        bias2 = [b for part in parts for b in part.bias2]
        # $$\hat L = L / (1 - \beta_2^k)$$, root of the bias-corrected factor (Meta's step 3)
        if all(b == bias2[0] for b in bias2):
            corrected = factors / bias2[0]
        else:
            corrected = factors / _device_tensor(bias2, factors.dtype, factors.device)[:, None, None]
        (method, dtype), *fallbacks = _root_attempts(root_method, dtype)
        roots, finite, ok = _batched_roots_or_each(corrected, exponent, eps, dtype, method)
        results[key] = [corrected, roots, finite, ok, fallbacks]

    # the one host read of this root computation: every factor's (finite, ok)
    keys = list(results)
    flags = torch.cat([torch.stack([results[k][2], results[k][3]]) for k in keys], dim=1).tolist()
    host: dict[tuple, tuple[list[bool], list[bool]]] = {}
    col = 0
    for k in keys:
        n = results[k][2].shape[0]
        host[k] = (flags[0][col : col + n], flags[1][col : col + n])
        col += n
    for k in keys:  # retries: only a failed root gets here (its own reads, off the common path)
        corrected, roots, finite, ok, fallbacks = results[k]
        finite_h, ok_h = host[k]
        for method, dtype in fallbacks:
            redo = [i for i in range(len(ok_h)) if finite_h[i] and not ok_h[i]]
            if not redo:
                break
            index = torch.tensor(redo, device=roots.device)
            r2, _, ok2 = _batched_roots_or_each(corrected.index_select(0, index), k[2], eps, dtype, method)
            if roots.dtype != r2.dtype and r2.dtype == torch.float64:
                roots = roots.to(torch.float64)
            roots = roots.index_copy(0, index, r2.to(roots.dtype))
            ok = ok.index_copy(0, index, ok2)
            for i, good in zip(redo, ok2.tolist(), strict=True):
                ok_h[i] = good
        results[k][1], results[k][3] = roots, ok

    failures = 0
    by_group: dict[_Group, dict[str, tuple[tuple, _RootPart]]] = {}
    for key, parts in batches.items():
        for part in parts:
            by_group.setdefault(part.group, {})[part.side] = (key, part)
    for g, index, rows in selected:
        sides = by_group[g]
        ok_block = None
        ok_host = [True] * len(rows)
        for key, part in sides.values():
            sl = slice(part.offset, part.offset + len(rows))
            ok_part = results[key][3][sl]
            ok_block = ok_part if ok_block is None else ok_block & ok_part
            ok_host = [a and b for a, b in zip(ok_host, host[key][1][sl], strict=True)]
        for key, part in sides.values():
            new = results[key][1][part.offset : part.offset + len(rows)].to(g.root_dtype)
            buf = g.bufs[part.side + "_root"]
            # a block takes its new roots only when both sides succeeded; otherwise it keeps its last ones
            _write_rows_where(buf, index, ok_block, new)
        for r, good in zip(rows, ok_host, strict=True):
            info, b = g.entry_blocks[r]
            if good:
                info.state["root_ready"][b] = True
            else:
                info.state["root_failures"] += 1
                failures += 1
    return failures


def shampoo_update(
    params: list[Tensor],
    grads: list[Tensor],
    states: list[dict[str, Any]],
    *,
    lr: float,
    betas: tuple[float, float],
    eps: float,
    graft_eps: float,
    weight_decay: float,
    exponents: tuple[float, float],
    grafting: str,
    precondition_frequency: int,
    start_preconditioning_step: int,
    max_preconditioner_dim: int,
    factor_dtype: torch.dtype,
    statistics_frequency: int = 1,
    root_dtype: torch.dtype | str = torch.float64,
    root_method: str = "eigh",
    layout_cache: dict[str, Any] | None = None,
) -> int:
    """One AdamW-style Shampoo step on ``params`` in place: the pure update function the class calls.

    Element-wise moments are updated for all parameters at once (``torch._foreach_*``); the blocks of all matrix
    parameters are grouped by shape and each group's factor update, root refresh and preconditioned direction
    are batched calls (``baddbmm``, batched ``eigh`` or Newton, ``bmm``). No step reads from the device except
    a root computation (one read, plus the one inside each ``torch.linalg.eigh`` call).

    Args:
        params: parameters (>= 2-D tensors are preconditioned as (d0, rest) matrices; 0-/1-D take the grafted step).
        grads: their dense, finite gradients.
        states: one state dict per parameter (initialised on first use).
        lr, betas, eps, graft_eps, weight_decay, exponents, grafting, precondition_frequency,
        start_preconditioning_step, max_preconditioner_dim, factor_dtype, statistics_frequency, root_dtype,
        root_method: as in ``Shampoo``.
        layout_cache: a dict kept between calls (the class keeps one per param group) holding the stacked
            layout of the blocks; without it each call stacks the state afresh (same result, more copies).

    Returns:
        The number of blocks whose preconditioner failed to decompose in this step (they kept their last root,
        or took the grafted step).
    """
    if not params:
        return 0
    for p, st in zip(params, states, strict=True):
        if not st:
            init_state(
                p,
                st,
                exponents=param_exponents(exponents, matrix_shape(p)),
                max_preconditioner_dim=max_preconditioner_dim,
                factor_dtype=factor_dtype,
            )
    beta1, beta2 = betas
    exp_avgs = [st["exp_avg"] for st in states]
    exp_avg_sqs = [st["exp_avg_sq"] for st in states]
    gs = [g.to(m.dtype) for g, m in zip(grads, exp_avgs, strict=True)]
    for st in states:
        st["step"] += 1
    bias1 = [1.0 - beta1 ** st["step"] for st in states]

    # $$M_k = \beta_1 M_{k-1} + (1 - \beta_1) G_k$$
    torch._foreach_lerp_(exp_avgs, gs, 1.0 - beta1)
    # $$V_k = \beta_2 V_{k-1} + (1 - \beta_2) G_k^2$$   (grafting / 1-D state)
    torch._foreach_mul_(exp_avg_sqs, beta2)
    torch._foreach_addcmul_(exp_avg_sqs, gs, gs, value=1.0 - beta2)
    # the grafted direction times 1 - b1^k: Adam M / (sqrt(V^) + eps_g), or M for SGD grafting
    if grafting == "sgd":
        grafts = exp_avgs
    else:
        denoms = torch._foreach_sqrt(exp_avg_sqs)
        torch._foreach_div_(denoms, [math.sqrt(1.0 - beta2 ** st["step"]) for st in states])
        torch._foreach_add_(denoms, graft_eps)
        grafts = torch._foreach_div(exp_avgs, denoms)

    # $$X_{k+1} = (1 - \eta\lambda) X_k - \eta D_k$$   (decoupled weight decay, AdamW-style)
    if weight_decay != 0.0:
        torch._foreach_mul_(params, 1.0 - lr * weight_decay)

    matrices = [i for i, st in enumerate(states) if "left" in st]
    directions: dict[int, Tensor] = {}
    failures = 0
    if matrices:
        layout = _get_layout(layout_cache, params, states, matrices, exponents, max_preconditioner_dim)
        index_of = {id(params[i]): i for i in matrices}
        s = statistics_frequency
        steps = {states[i]["step"] for i in matrices}
        # every parameter of the layout in this step, all at one step count: each group takes all its rows
        uniform = len(steps) == 1 and len(index_of) == len(layout.params)

        def selected(g: _Group, chosen: set[int] | None) -> list[_Source]:
            if chosen is None:
                return g.sources
            return [src for src in g.sources if id(src.info.param) in chosen]

        # statistics every s steps (at k = 1, 1 + s, ...), each with weight beta2^s, so the factor stays an EMA
        # over the same time scale; s = 1 is the paper's rule
        beta = beta2**s
        if uniform:
            updating = None if (next(iter(steps)) - 1) % s == 0 else set()
        else:
            updating = {id(params[i]) for i in matrices if (states[i]["step"] - 1) % s == 0}
        for g in layout.groups if updating is None or updating else ():
            sources = selected(g, updating)
            if not sources:
                continue
            index, _ = g.entries(sources)
            if (
                g.n == 1 and g.all_whole
            ):  # a lone block: addmm_ on the state's 2-D views (G G^T is faster there)
                info = sources[0].info
                g2 = gs[index_of[id(info.param)]].reshape(info.shape)
                factor = (info.lists["left"] or info.lists["right"])[0]
                if g2.dtype != factor.dtype:
                    g2 = g2.to(factor.dtype)
                if g.e_left > 0:
                    # $$L_k = \beta_2 L_{k-1} + (1 - \beta_2) G_k G_k^\top$$
                    info.lists["left"][0].addmm_(g2, g2.T, beta=beta, alpha=1.0 - beta)
                if g.e_right > 0:
                    # $$R_k = \beta_2 R_{k-1} + (1 - \beta_2) G_k^\top G_k$$
                    info.lists["right"][0].addmm_(g2.T, g2, beta=beta, alpha=1.0 - beta)
                continue
            blocks = _gather([src.take(gs[index_of[id(src.info.param)]]) for src in sources])
            factor = g.bufs["left"] if g.bufs["left"] is not None else g.bufs["right"]
            if blocks.dtype != factor.dtype:
                blocks = blocks.to(factor.dtype)
            if g.bufs["left"] is not None:
                # $$L_k = \beta_2 L_{k-1} + (1 - \beta_2) G_k G_k^\top$$
                _baddbmm_rows(g.bufs["left"], index, blocks, blocks.mT, beta=beta, alpha=1.0 - beta)
            if g.bufs["right"] is not None:
                # $$R_k = \beta_2 R_{k-1} + (1 - \beta_2) G_k^\top G_k$$
                _baddbmm_rows(g.bufs["right"], index, blocks.mT, blocks, beta=beta, alpha=1.0 - beta)

        started = [i for i in matrices if states[i]["step"] >= start_preconditioning_step]
        due = {}
        for i in started:
            k = states[i]["step"]
            if (k - start_preconditioning_step) % precondition_frequency == 0:
                n_updates = (k - 1) // s + 1
                due[id(params[i])] = 1.0 - beta2 ** (s * n_updates)
        if due:
            failures = _refresh_roots(layout, due, eps=eps, root_dtype=root_dtype, root_method=root_method)

        all_ready = len(started) == len(matrices) and all(all(states[i]["root_ready"]) for i in started)
        if uniform and all_ready:
            preconditioned = None
        else:
            preconditioned = {id(params[i]) for i in started if any(states[i]["root_ready"])}
        for g in layout.groups if preconditioned is None or preconditioned else ():
            sources = selected(g, preconditioned)
            if not sources:
                continue
            index, rows = g.entries(sources)
            pos = [index_of[id(src.info.param)] for src in sources]
            if g.n == 1 and g.all_whole:  # a lone block: 2-D products on the state's own views (fewer calls)
                info, i = sources[0].info, pos[0]
                # $$D = (\hat L + \epsilon I)^{-1/(2p)} \hat M (\hat R + \epsilon I)^{-1/(2q)}$$   (times 1 - b1^k)
                direction = exp_avgs[i].reshape(info.shape)
                if g.e_left > 0:
                    direction = torch.mm(info.lists["left_root"][0], direction)
                if g.e_right > 0:
                    direction = torch.mm(direction, info.lists["right_root"][0])
                if grafting != "none":
                    norm = torch.linalg.vector_norm(direction).clamp_min(1e-30)
                    direction = direction * (torch.linalg.vector_norm(grafts[i]) / norm)
                directions[i] = direction
                continue
            # $$D = (\hat L + \epsilon I)^{-1/(2p)} \hat M (\hat R + \epsilon I)^{-1/(2q)}$$   (times 1 - b1^k)
            direction = _gather([src.take(exp_avgs[i]) for src, i in zip(sources, pos, strict=True)])
            if g.e_left > 0:
                direction = torch.bmm(_rows(g.bufs["left_root"], index), direction)
            if g.e_right > 0:
                direction = torch.bmm(direction, _rows(g.bufs["right_root"], index))
            if grafting != "none":
                # layer-wise grafting: the Shampoo direction rescaled to the grafted step's norm (per block)
                if g.all_whole:  # one norm per parameter: a single foreach call, nothing gathered
                    scale = torch.stack(torch._foreach_norm([grafts[i] for i in pos]))
                else:
                    scale = torch.cat([src.norms(grafts[i]) for src, i in zip(sources, pos, strict=True)])
                scale = scale / torch.linalg.vector_norm(direction, dim=(-2, -1)).clamp_min(1e-30)
                direction = direction * scale.view(-1, 1, 1)
            if not all_ready and not all(all(src.info.state["root_ready"]) for src in sources):
                # a block without a root yet keeps the grafted step
                ready = [g.entry_blocks[r][0].state["root_ready"][g.entry_blocks[r][1]] for r in rows]
                graft = _gather([src.take(grafts[i]) for src, i in zip(sources, pos, strict=True)])
                direction = torch.where(g.mask(ready).view(-1, 1, 1), direction, graft)
            if g.all_whole:
                for i, piece in zip(pos, direction.unbind(0), strict=True):
                    directions[i] = piece
                continue
            offset = 0
            for src, i in zip(sources, pos, strict=True):
                piece = direction.narrow(0, offset, src.count)
                offset += src.count
                if src.whole:
                    directions[i] = piece[0]
                else:
                    if i not in directions:
                        directions[i] = torch.empty(src.info.shape, dtype=piece.dtype, device=piece.device)
                    src.put(directions[i], piece)

    plain: list[int] = []
    precond_params: list[Tensor] = []
    precond_dirs: list[Tensor] = []
    precond_scalars: list[float] = []
    for i, p in enumerate(params):
        if i in directions:
            precond_params.append(p)
            precond_dirs.append(directions[i].reshape(p.shape).to(p.dtype))
            precond_scalars.append(-lr / bias1[i])
        else:
            plain.append(i)
    if precond_params:
        # one foreach call for every preconditioned parameter: X <- X - lr/(1 - b1^k) D
        torch._foreach_add_(precond_params, torch._foreach_mul(precond_dirs, precond_scalars))
    if plain:
        scalars = [-lr / bias1[i] for i in plain]
        if grafting == "sgd":
            steps = torch._foreach_mul([exp_avgs[i] for i in plain], scalars)
            torch._foreach_add_([params[i] for i in plain], steps)
        else:
            # exactly AdamW's update: X <- X - lr/(1 - b1^k) * M / (sqrt(V^) + eps_g)
            torch._foreach_addcdiv_(
                [params[i] for i in plain], [exp_avgs[i] for i in plain], [denoms[i] for i in plain], scalars
            )
    return failures


def _check_hparams(group: dict[str, Any]) -> None:
    lr = group["lr"]
    if isinstance(lr, Tensor):
        raise TypeError("lr must be a float, not a Tensor")
    if not isinstance(lr, (int, float)) or isinstance(lr, bool) or not math.isfinite(lr) or lr < 0:
        raise ValueError(f"lr must be a finite number >= 0, got {lr!r}")
    betas = group["betas"]
    if (
        not isinstance(betas, (tuple, list))
        or len(betas) != 2
        or not all(isinstance(b, (int, float)) and 0.0 <= b < 1.0 for b in betas)
    ):
        raise ValueError(f"betas must be two numbers in [0, 1), got {betas!r}")
    for name in ("eps", "graft_eps"):
        v = group[name]
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) or v <= 0:
            raise ValueError(f"{name} must be a finite number > 0, got {v!r}")
    wd = group["weight_decay"]
    if not isinstance(wd, (int, float)) or isinstance(wd, bool) or not math.isfinite(wd) or wd < 0:
        raise ValueError(f"weight_decay must be a finite number >= 0, got {wd!r}")
    if group["grafting"] not in GRAFTINGS:
        raise ValueError(f"grafting must be one of {GRAFTINGS}, got {group['grafting']!r}")
    for name in (
        "precondition_frequency",
        "start_preconditioning_step",
        "max_preconditioner_dim",
        "statistics_frequency",
    ):
        v = group[name]
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ValueError(f"{name} must be an int >= 1, got {v!r}")
    if group["factor_dtype"] not in (torch.float32, torch.float64):
        raise ValueError(
            f"factor_dtype must be torch.float32 or torch.float64, got {group['factor_dtype']!r}"
        )
    if not any(group["root_dtype"] is d or group["root_dtype"] == d for d in ROOT_DTYPES):
        raise ValueError(
            f"root_dtype must be 'auto', torch.float32 or torch.float64, got {group['root_dtype']!r}"
        )
    if not isinstance(group["check_finite"], bool):
        raise TypeError(f"check_finite must be a bool, got {group['check_finite']!r}")
    if group["root_method"] not in ROOT_METHODS:
        raise ValueError(f"root_method must be one of {ROOT_METHODS}, got {group['root_method']!r}")
    if group["root_method"] == "newton":
        exps = group["exponents"]
        candidates = (0.5,) if exps == SMALLER_SIDE else [e for e in exps if e > 0]
        bad = [e for e in candidates if _newton_order(e) is None]
        if bad:
            raise ValueError(
                f"root_method='newton' needs exponents 1/p for integer p (the coupled Newton iteration), "
                f"got {bad}; use root_method='eigh'"
            )


class Shampoo(torch.optim.Optimizer):
    """AdamW-style Shampoo: Kronecker-factored, one- or two-sided preconditioning with decoupled weight decay.

    The update for a matrix parameter (see the module docstring for every step) is

        X <- (1 - lr wd) X - lr (L^ + eps I)^(-1/(2p)) M^ (R^ + eps I)^(-1/(2q)),   1/p + 1/q = 1.

    Args:
        params: parameters or param groups (per-group overrides of every argument below work).
        lr: learning rate (with Adam grafting, AdamW-like values; without grafting about 10x AdamW's).
        betas: (b1, b2) for the first moment and for the factors / grafting second moment, each in [0, 1).
        eps: added as eps I to each factor before its inverse root (also the eigenvalue floor).
        weight_decay: decoupled (AdamW-style) weight decay.
        exponents: ``(1/(2p), 1/(2q))`` or ``"two_sided"`` (1/4, 1/4), ``"left"`` (1/2, 0), ``"right"`` (0, 1/2),
            ``"smaller"`` (one-sided on each matrix's smaller side: one root of size min(m, n), the cheapest).
        precondition_frequency: recompute the inverse roots every this many steps (amortised cost).
        start_preconditioning_step: first step that uses the preconditioner (default: ``precondition_frequency``);
            before it the step is the grafting method's (AdamW for ``grafting="adam"``).
        max_preconditioner_dim: dimensions larger than this are split into blocks with their own factors.
        grafting: ``"adam"`` (default), ``"sgd"`` or ``"none"`` (the paper's pure rule).
        graft_eps: epsilon of the Adam grafting direction.
        factor_dtype: dtype of the stored factors.
        statistics_frequency: update the factors every this many steps (at steps 1, 1 + s, ...), each update
            weighted ``b2^s`` so the factors average over the same horizon; 1 (default) is the paper's rule, 10
            cuts the two ``addmm`` per block by 10x (README, speed table).
        root_dtype: precision of the eigendecompositions: ``"auto"`` (default) uses the moments' dtype (float32
            for float32/bfloat16/float16 parameters, retried in float64 when float32 fails or gives non-finite
            values; float64 for float64 parameters), or force ``torch.float32`` / ``torch.float64``.
        check_finite: raise ``ValueError`` on NaN/Inf gradients before touching the state (default ``True``;
            one max-abs reduction per group and step, which cannot overflow for finite float16 gradients, and
            the step's one host read: raising needs the answer). ``False`` skips it: a NaN gradient then
            corrupts the state, and a step without a root computation reads nothing from the device.
        root_method: ``"eigh"`` (default: batched symmetric eigendecompositions) or ``"newton"`` (the coupled
            Newton iteration for the inverse p-th root, ``NEWTON_ITERATIONS`` batched matrix-product steps in
            ``root_dtype``; a root whose residual max |X^p (A + eps I) - I| exceeds ``NEWTON_TOLERANCE_ULPS``
            units of roundoff falls back to the eigendecomposition, decided on the device). Meant for
            accelerators: on a CPU an eigendecomposition is cheaper (README, Benchmark).

    Raises:
        ValueError / TypeError: a hyper-parameter out of range (naming it), complex parameters; at ``step``, a
            sparse or non-finite gradient.

    Example: see the module docstring; ``Shampoo(model.parameters(), lr=1e-3)`` is a drop-in for AdamW.
    """

    def __init__(
        self,
        params: Iterable[Tensor] | Iterable[dict[str, Any]],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-6,
        weight_decay: float = 0.0,
        exponents: tuple[float, float] | str = (0.25, 0.25),
        precondition_frequency: int = 10,
        start_preconditioning_step: int | None = None,
        max_preconditioner_dim: int = 1024,
        grafting: str = "adam",
        graft_eps: float = 1e-8,
        factor_dtype: torch.dtype = torch.float32,
        statistics_frequency: int = 1,
        root_dtype: torch.dtype | str = "auto",
        check_finite: bool = True,
        root_method: str = "eigh",
    ):
        if start_preconditioning_step is None:
            start_preconditioning_step = precondition_frequency
        defaults = dict(
            lr=lr,
            betas=tuple(betas) if isinstance(betas, (tuple, list)) else betas,
            eps=eps,
            weight_decay=weight_decay,
            exponents=resolve_exponents(exponents),
            precondition_frequency=precondition_frequency,
            start_preconditioning_step=start_preconditioning_step,
            max_preconditioner_dim=max_preconditioner_dim,
            grafting=grafting,
            graft_eps=graft_eps,
            factor_dtype=factor_dtype,
            statistics_frequency=statistics_frequency,
            root_dtype=root_dtype,
            check_finite=check_finite,
            root_method=root_method,
        )
        _check_hparams(defaults)
        super().__init__(params, defaults)
        self._warned_root_failure = False
        # per param group: the stacked layout of its blocks (``_Layout``), rebuilt when the state is replaced
        self._layouts: dict[int, dict[str, Any]] = {}

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        self.__dict__.setdefault("_warned_root_failure", False)
        self.__dict__.setdefault("_layouts", {})

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        if "exponents" in param_group:
            param_group = {**param_group, "exponents": resolve_exponents(param_group["exponents"])}
        super().add_param_group(param_group)
        _check_hparams(self.param_groups[-1])
        bad = [tuple(p.shape) for p in self.param_groups[-1]["params"] if p.is_complex()]
        if bad:
            self.param_groups.pop()
            raise TypeError(
                f"params: Shampoo supports real parameters only; got complex parameters of shapes {bad} "
                "(optimise their real and imaginary parts as separate real tensors)"
            )

    @torch.no_grad()
    def step(self, closure: Callable[[], Tensor] | None = None) -> Tensor | None:
        """Perform one optimisation step; ``closure`` re-evaluates the model and returns the loss."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for gi, group in enumerate(self.param_groups):
            params = [p for p in group["params"] if p.grad is not None]
            if any(p.grad.is_sparse for p in params):
                raise ValueError("Shampoo does not support sparse gradients")
            if group["check_finite"]:
                _check_finite([p.grad for p in params])
            hyper = {
                k: group[k]
                for k in (
                    "lr",
                    "betas",
                    "eps",
                    "graft_eps",
                    "weight_decay",
                    "exponents",
                    "grafting",
                    "precondition_frequency",
                    "start_preconditioning_step",
                    "max_preconditioner_dim",
                    "factor_dtype",
                    "statistics_frequency",
                    "root_dtype",
                    "root_method",
                )
            }
            failures = shampoo_update(
                params,
                [p.grad for p in params],
                [self.state[p] for p in params],
                layout_cache=self._layouts.setdefault(gi, {}),
                **hyper,
            )
            if failures and not self._warned_root_failure:
                self._warned_root_failure = True
                warnings.warn(
                    f"Shampoo: {failures} preconditioner block(s) failed to decompose; each keeps its last root, or "
                    "takes the grafted step until a root is available (warned once per optimizer)",
                    RuntimeWarning,
                    stacklevel=2,
                )
        return loss

    @torch.no_grad()
    def initialize_state(self) -> None:
        """Create every parameter's state (zero moments and factors, identity roots, step 0) without a step.

        ``torch.distributed.checkpoint`` loads *into* an existing state dict. Its ``get_state_dict`` initialises an
        empty optimizer itself (one zero-gradient step at lr 0); this creates the same tensors without a step,
        for ``dcp.load`` into ``optimizer.state_dict()`` directly.
        """
        for group in self.param_groups:
            for p in group["params"]:
                if not self.state[p]:
                    init_state(
                        p,
                        self.state[p],
                        exponents=param_exponents(group["exponents"], matrix_shape(p)),
                        max_preconditioner_dim=group["max_preconditioner_dim"],
                        factor_dtype=group["factor_dtype"],
                    )

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load a state dict, keeping the state's own dtypes (torch would cast it to bfloat16 parameters' dtype)."""
        saved_state = copy.deepcopy(state_dict["state"])
        super().load_state_dict(state_dict)
        for group in self.param_groups:  # state dicts saved before these options existed
            group.setdefault("statistics_frequency", 1)
            group.setdefault("root_dtype", "auto")
            group.setdefault("check_finite", True)
            group.setdefault("root_method", "eigh")
        self._layouts.clear()  # the loaded state is stacked afresh on the next step
        saved_ids = itertools.chain.from_iterable(g["params"] for g in state_dict["param_groups"])
        params = itertools.chain.from_iterable(g["params"] for g in self.param_groups)
        for pid, p in zip(saved_ids, params, strict=True):
            if pid in saved_state:
                self.state[p] = _to_device(saved_state[pid], p.device)

    def optimizer_state_bytes(self) -> int:
        """Bytes held in the optimizer state (moments, factors and roots)."""
        total = 0
        for st in self.state.values():
            for v in st.values():
                for t in v if isinstance(v, list) else [v]:
                    if isinstance(t, Tensor):
                        total += t.numel() * t.element_size()
        return total


def _check_finite(grads: list[Tensor]) -> None:
    """Raise ``ValueError`` if any gradient has NaN/Inf (one synchronisation for the whole group).

    The test is the max-abs (infinity) norm, which is finite exactly when every entry is: unlike the 2-norm it
    cannot overflow on finite gradients (1000 in every entry of a 100x100 float16 matrix, or float32 entries
    near 1e30).
    """
    if not grads:
        return
    norms = torch._foreach_norm(grads, ord=math.inf)
    finite = torch.isfinite(torch.stack([n.to(torch.float32) for n in norms]))
    if not bool(finite.all()):
        bad = [tuple(g.shape) for g, ok in zip(grads, finite.tolist(), strict=True) if not ok]
        raise ValueError(
            f"gradients of parameters of shapes {bad} contain NaN or Inf; Shampoo stops before "
            "corrupting its state (check the loss)"
        )


def _to_device(value: Any, device: torch.device) -> Any:
    if isinstance(value, Tensor):
        return value.to(device)
    if isinstance(value, list):
        return [_to_device(v, device) for v in value]
    if isinstance(value, dict):
        return {k: _to_device(v, device) for k, v in value.items()}
    return value
