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
  precision by default (float32 with a float64 retry; float64 for float64 parameters: ``root_dtype``);
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


def matrix_inverse_root(
    factor: Tensor, exponent: float, eps: float, dtype: torch.dtype = torch.float64
) -> Tensor:
    """``(A + eps I)^(-exponent)`` of a symmetric PSD matrix by eigendecomposition in ``dtype``.

    The factor is symmetrised, ``eps I`` added, and eigenvalues below ``eps`` (round-off) clamped to ``eps``.
    With ``dtype=torch.float32`` a decomposition that fails or returns non-finite values is retried in float64
    (Meta's ``EigenConfig(retry_double_precision=True)``).

    Raises:
        ValueError: the factor has NaN/Inf entries.
        torch.linalg.LinAlgError: the eigendecomposition did not converge (in float64).
    """
    if dtype != torch.float64:
        try:
            root = _inverse_root(factor, exponent, eps, dtype)
        except torch.linalg.LinAlgError:
            root = None
        if root is not None and bool(torch.isfinite(root).all()):
            return root
    return _inverse_root(factor, exponent, eps, torch.float64)


def _inverse_root(factor: Tensor, exponent: float, eps: float, dtype: torch.dtype) -> Tensor:
    a = factor.to(dtype)
    if not torch.isfinite(a).all():
        raise ValueError("the Kronecker factor has non-finite entries")
    a = 0.5 * (a + a.T)
    a.diagonal().add_(eps)
    # $$(A + \epsilon I)^{-e} = Q \, \mathrm{diag}(\lambda^{-e}) \, Q^\top$$
    eigenvalues, eigenvectors = torch.linalg.eigh(a)
    eigenvalues = eigenvalues.clamp_min(eps)
    return (eigenvectors * eigenvalues.pow(-exponent)) @ eigenvectors.T


def init_state(
    param: Tensor,
    state: dict[str, Any],
    *,
    exponents: tuple[float, float],
    max_preconditioner_dim: int,
    factor_dtype: torch.dtype,
) -> None:
    """Create the per-parameter state: moments, and per block the factors and their inverse roots."""
    work = torch.float64 if param.dtype == torch.float64 else torch.float32
    state["step"] = 0
    state["exp_avg"] = torch.zeros(param.shape, dtype=work, device=param.device)
    state["exp_avg_sq"] = torch.zeros(param.shape, dtype=work, device=param.device)
    shape = matrix_shape(param)
    if shape is None:
        return
    root_dtype = work  # roots are computed in float64 and stored in the moments' dtype
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


def _refresh_roots(
    state: dict[str, Any],
    *,
    exponents: tuple[float, float],
    eps: float,
    bias2: float,
    n_blocks: int,
    root_dtype: torch.dtype,
) -> int:
    """Recompute every block's inverse roots; return how many blocks failed to decompose (they keep theirs)."""
    e_left, e_right = exponents
    failures = 0
    for b in range(n_blocks):
        try:
            # $$\hat L = L / (1 - \beta_2^k)$$, root of the bias-corrected factor (Meta's step 3)
            new_left = (
                matrix_inverse_root(state["left"][b] / bias2, e_left, eps, root_dtype) if e_left > 0 else None
            )
            new_right = (
                matrix_inverse_root(state["right"][b] / bias2, e_right, eps, root_dtype)
                if e_right > 0
                else None
            )
        except (ValueError, torch.linalg.LinAlgError):
            state["root_failures"] += 1
            failures += 1
            continue
        if new_left is not None:
            state["left_root"][b].copy_(new_left)
        if new_right is not None:
            state["right_root"][b].copy_(new_right)
        state["root_ready"][b] = True
    return failures


def _preconditioned_direction(
    state: dict[str, Any],
    g: Tensor,
    exp_avg: Tensor,
    graft: Tensor,
    *,
    beta2: float,
    eps: float,
    exponents: tuple[float, float],
    grafting: str,
    precondition_frequency: int,
    start_preconditioning_step: int,
    max_preconditioner_dim: int,
    factor_dtype: torch.dtype,
    statistics_frequency: int = 1,
    root_dtype: torch.dtype = torch.float64,
) -> tuple[Tensor | None, int]:
    """Update one matrix parameter's factors (and roots when due).

    Returns:
        ``(direction, failures)``: the Shampoo direction times ``1 - b1^k``, or ``None`` when the parameter
        takes the grafted step (1-D, not started, or no root yet); and how many blocks failed to decompose.
    """
    shape = matrix_shape(exp_avg)
    if shape is None:
        return None, 0
    k = state["step"]
    e_left, e_right = exponents
    blocks = block_slices(shape, max_preconditioner_dim)
    one_block = len(blocks) == 1
    # statistics every `statistics_frequency` = s steps (at k = 1, 1 + s, ...), each with weight beta2^s, so the
    # factor stays an EMA over the same time scale; s = 1 is the paper's rule
    n_updates = (k - 1) // statistics_frequency + 1
    if (k - 1) % statistics_frequency == 0:
        beta = beta2**statistics_frequency
        g2 = g.reshape(shape)
        if g2.dtype != factor_dtype:
            g2 = g2.to(factor_dtype)
        for b, (rows, cols) in enumerate(blocks):
            gb = g2 if one_block else g2[rows, cols]
            if e_left > 0:
                # $$L_k = \beta_2 L_{k-1} + (1 - \beta_2) G_k G_k^\top$$
                state["left"][b].addmm_(gb, gb.T, beta=beta, alpha=1.0 - beta)
            if e_right > 0:
                # $$R_k = \beta_2 R_{k-1} + (1 - \beta_2) G_k^\top G_k$$
                state["right"][b].addmm_(gb.T, gb, beta=beta, alpha=1.0 - beta)
    if k < start_preconditioning_step:
        return None, 0
    failures = 0
    if (k - start_preconditioning_step) % precondition_frequency == 0:
        bias2 = 1.0 - beta2 ** (statistics_frequency * n_updates)
        failures = _refresh_roots(
            state, exponents=exponents, eps=eps, bias2=bias2, n_blocks=len(blocks), root_dtype=root_dtype
        )
    if not any(state["root_ready"]):
        return None, failures

    m2, graft2 = exp_avg.reshape(shape), graft.reshape(shape)
    direction = graft2 if one_block else graft2.clone()
    for b, (rows, cols) in enumerate(blocks):
        if not state["root_ready"][b]:
            continue  # no root yet for this block: it keeps the grafted step
        # $$D = (\hat L + \epsilon I)^{-1/(2p)} \hat M (\hat R + \epsilon I)^{-1/(2q)}$$   (times 1 - b1^k)
        pb = m2 if one_block else m2[rows, cols]
        if e_left > 0:
            pb = torch.mm(state["left_root"][b], pb)
        if e_right > 0:
            pb = torch.mm(pb, state["right_root"][b])
        if grafting != "none":
            # layer-wise grafting: the Shampoo direction rescaled to the grafted step's norm (per block)
            gb = graft2 if one_block else graft2[rows, cols]
            pb = pb * (torch.linalg.vector_norm(gb) / torch.linalg.vector_norm(pb).clamp_min(1e-30))
        if one_block:
            direction = pb
        else:
            direction[rows, cols] = pb
    return direction, failures


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
) -> int:
    """One AdamW-style Shampoo step on ``params`` in place: the pure update function the class calls.

    Element-wise moments are updated for all parameters at once (``torch._foreach_*``); each matrix parameter
    then gets its factor update, amortised root refresh and preconditioned direction.

    Args:
        params: parameters (>= 2-D tensors are preconditioned as (d0, rest) matrices; 0-/1-D take the grafted step).
        grads: their dense, finite gradients.
        states: one state dict per parameter (initialised on first use).
        lr, betas, eps, graft_eps, weight_decay, exponents, grafting, precondition_frequency,
        start_preconditioning_step, max_preconditioner_dim, factor_dtype, statistics_frequency, root_dtype: as in
        ``Shampoo``.

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
    plain: list[int] = []
    precond_params: list[Tensor] = []
    precond_dirs: list[Tensor] = []
    precond_scalars: list[float] = []
    failures = 0
    for i, (p, st) in enumerate(zip(params, states, strict=True)):
        # roots in the working precision (float32 with a float64 retry; float64 for float64 parameters) unless set
        rdtype = exp_avgs[i].dtype if root_dtype == "auto" else root_dtype
        direction, failed = _preconditioned_direction(
            st,
            gs[i],
            exp_avgs[i],
            grafts[i],
            beta2=beta2,
            eps=eps,
            exponents=param_exponents(exponents, matrix_shape(p)),
            grafting=grafting,
            precondition_frequency=precondition_frequency,
            start_preconditioning_step=start_preconditioning_step,
            max_preconditioner_dim=max_preconditioner_dim,
            factor_dtype=factor_dtype,
            statistics_frequency=statistics_frequency,
            root_dtype=rdtype,
        )
        failures += failed
        if direction is None:
            plain.append(i)
        else:
            precond_params.append(p)
            precond_dirs.append(direction.reshape(p.shape).to(p.dtype))
            precond_scalars.append(-lr / bias1[i])
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
            one max-abs reduction per group and step, which cannot overflow for finite float16 gradients).
            ``False`` skips it: a NaN gradient then corrupts the state.

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
        )
        _check_hparams(defaults)
        super().__init__(params, defaults)
        self._warned_root_failure = False

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
        for group in self.param_groups:
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
                )
            }
            failures = shampoo_update(
                params, [p.grad for p in params], [self.state[p] for p in params], **hyper
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
