"""Verify a network's floating-point values and autodiff gradients against targets, point by point.

A target is hit when the computed float equals it (IEEE equality: +0 and -0 count as equal, NaN never does);
otherwise the distance is counted in units in the last place (ulps, the number of floats between the two). The
sign of zero is reported separately (``zero_sign_mismatch``): a -0 target computed as +0, or the reverse, is hit by
IEEE equality but differs in its bits.

Example:
    >>> import torch
    >>> ulp_distance(torch.tensor([1.0, 1.0]), torch.tensor([1.0, float(torch.nextafter(torch.tensor(1.0),
    ...                                                                                  torch.tensor(2.0)))]))
    tensor([0., 1.], dtype=torch.float64)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

_INT = {torch.float32: torch.int32, torch.float16: torch.int16, torch.bfloat16: torch.int16,
        torch.float64: torch.int64}


def ulp_distance(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Floats strictly between ``a`` and ``b`` plus one (0 when equal, +-0 equal; inf with a NaN or an infinity)."""
    if a.dtype != b.dtype or a.dtype not in _INT:
        raise TypeError(f"a and b must share a float dtype, got {a.dtype} and {b.dtype}")
    bits = 8 * a.element_size()

    def ordered(x: torch.Tensor) -> torch.Tensor:
        i = x.contiguous().view(_INT[x.dtype]).to(torch.int64)
        sign = i < 0
        mag = i & ((1 << (bits - 1)) - 1)
        return torch.where(sign, -mag, mag)

    d = (ordered(a) - ordered(b)).abs().to(torch.float64)
    bad = ~(torch.isfinite(a) & torch.isfinite(b))
    return torch.where(bad, torch.full_like(d, float("inf")), d)


@dataclass
class VerificationResult:
    """Per-point exactness of values and gradients.

    Attributes:
        exact_value: ``(n,)`` bool.
        exact_grad: ``(n, d)`` bool.
        value_ulps: ``(n,)`` ulp distances.
        grad_ulps: ``(n, d)`` ulp distances.
        unreachable: ``(n, d)`` bool: targets the network reports as unreachable (any kind).
        phi_unreachable: ``(n, d)`` bool: those of kind "phi" (no float slope reaches them through phi, decided
            from phi and the targets alone, not from the network's own backward pass).
        nonfinite: NaN or infinite values and gradients seen (their ulp distance is left out of the maxima).
        zero_sign_mismatch: ``(n, d)`` bool: gradient target and result both zero with different signs.
    """

    exact_value: torch.Tensor
    exact_grad: torch.Tensor
    value_ulps: torch.Tensor
    grad_ulps: torch.Tensor
    unreachable: torch.Tensor
    nonfinite: int
    phi_unreachable: torch.Tensor | None = None
    zero_sign_mismatch: torch.Tensor | None = None

    @property
    def exact_value_frac(self) -> float:
        return float(self.exact_value.double().mean())

    @property
    def exact_grad_frac(self) -> float:
        """Share of all gradient targets hit (unreachable ones count as missed)."""
        return float(self.exact_grad.double().mean())

    @property
    def exact_reachable_grad_frac(self) -> float:
        """Share of the gradient targets not reported unreachable that are hit (1.0 when none is). A diagnostic:
        the network's own report sets its denominator, so it cannot test the network; use exact_grad_frac or
        exact_phi_reachable_grad_frac."""
        reach = ~self.unreachable
        return float(self.exact_grad[reach].double().mean()) if reach.any() else 1.0

    @property
    def exact_phi_reachable_grad_frac(self) -> float:
        """Share of the gradient targets some float slope reaches through phi (decided from phi alone) that are
        hit (1.0 when there is none)."""
        mask = self.phi_unreachable if self.phi_unreachable is not None else torch.zeros_like(self.exact_grad)
        reach = ~mask
        return float(self.exact_grad[reach].double().mean()) if reach.any() else 1.0

    @property
    def zero_sign_mismatch_frac(self) -> float:
        """Share of gradient targets that are zeros of the other sign (IEEE-equal, bitwise different)."""
        m = self.zero_sign_mismatch
        return 0.0 if m is None else float(m.double().mean())

    @property
    def reachable_frac(self) -> float:
        return float((~self.unreachable).double().mean())

    @property
    def max_ulp_value(self) -> float:
        """Largest ulp distance among finite values."""
        finite = self.value_ulps[torch.isfinite(self.value_ulps)]
        return float(finite.max()) if len(finite) else 0.0

    @property
    def max_ulp_grad(self) -> float:
        """Largest ulp distance among finite gradients of reachable targets."""
        d = self.grad_ulps[~self.unreachable]
        d = d[torch.isfinite(d)]
        return float(d.max()) if len(d) else 0.0

    def summary(self) -> str:
        return (f"values exact {self.exact_value_frac:.4f} (max {self.max_ulp_value:g} ulp), gradients exact "
                f"{self.exact_grad_frac:.4f}, reachable ones {self.exact_reachable_grad_frac:.4f} (max "
                f"{self.max_ulp_grad:g} ulp), unreachable {int(self.unreachable.sum())}, non-finite {self.nonfinite}")


def verify(model: nn.Module, points: torch.Tensor, values: torch.Tensor, grads: torch.Tensor | None = None, *,
           phi: Callable[[torch.Tensor], torch.Tensor] | None = None,
           dtype: torch.dtype | None = None) -> VerificationResult:
    """Evaluate ``model`` at ``points`` in ``dtype`` and compare f(x_p) with ``values`` and autograd's
    D(phi o f)(x_p) with ``grads``.

    Args:
        model: maps ``(n,)`` (1-D) or ``(n, d)`` inputs to ``(n,)`` outputs, each row independently.
        points: the domain points.
        values: ``(n,)`` target values.
        grads: ``(n,)`` or ``(n, d)`` target gradients of phi o f (default: not checked, counted exact).
        phi: outer function (default identity).
        dtype: the format (default ``model.dtype`` or the points' dtype).

    Returns:
        a :class:`VerificationResult`.
    """
    dtype = dtype or getattr(model, "dtype", None) or points.dtype
    x = points.detach().to(dtype).clone().requires_grad_(True)
    out = model(x)
    if out.shape != (x.shape[0],):
        raise ValueError(f"model must return one value per point, shape ({x.shape[0]},), got {tuple(out.shape)}")
    loss = phi(out) if phi is not None else out
    (grad,) = torch.autograd.grad(loss.sum(), x)
    n = x.shape[0]
    grad = grad.reshape(n, -1)
    val_t = values.detach().to(dtype).reshape(n)
    exact_value = (out.detach() == val_t) & torch.isfinite(out.detach())
    value_ulps = ulp_distance(out.detach(), val_t)
    if grads is None:
        target = grad.detach()
    else:
        target = grads.detach().to(dtype).reshape(n, -1)
    exact_grad = (grad == target) & torch.isfinite(grad)
    grad_ulps = ulp_distance(grad.detach(), target)
    unreachable = torch.zeros_like(exact_grad)
    phi_unreachable = torch.zeros_like(exact_grad)
    for u in getattr(model, "unreachable", []):
        unreachable[u.point, u.coordinate] = True
        if getattr(u, "kind", "phi") == "phi":
            phi_unreachable[u.point, u.coordinate] = True
    nonfinite = int((~torch.isfinite(out)).sum() + (~torch.isfinite(grad)).sum())
    zero = (grad == 0) & (target == 0)
    sign_mismatch = zero & (torch.signbit(grad.detach()) != torch.signbit(target))
    return VerificationResult(exact_value, exact_grad, value_ulps, grad_ulps, unreachable, nonfinite,
                              phi_unreachable, sign_mismatch)
