"""The peer defences at the same scale: Lisa's bi-state alternation, Vaccine's perturbation-aware alignment,
SafeLoRA's projection, and safety-data mixing.

- **Lisa** (Huang et al., NeurIPS 2024; ``git-disl/Lisa``): the fine-tuning stage alternates ``align_steps``
  steps on alignment (safety) data with ``finetune_steps`` steps on the user's data, starting with alignment;
  after the first 10 % of the steps each state adds the proximal term ``rho/2 ||theta - theta_other||^2``
  towards the weights where the other state last stopped (official: rho = 1, 100 / 900 steps).
- **Vaccine** (Huang et al., NeurIPS 2024; ``git-disl/Vaccine``): alignment-stage training in which every step
  first records the gradient of the loss with respect to each attention block's output, then adds the
  perturbation ``rho * g_l / ||g||`` (global norm over blocks) to those outputs and trains on the perturbed
  forward pass.
- **SafeLoRA** (Hsu et al., NeurIPS 2024): with the alignment matrix ``V = W_aligned - W_unaligned`` of each
  target layer and ``C = V V^T / ||V||_F``, a fine-tuning update ``dW`` whose cosine similarity with ``C dW`` is
  below a threshold is replaced by ``C dW`` (applied here to the merged update, LoRA or full).
- **SFT + safety mix**: the selected safety data appended to the fine-tuning set (``mix_datasets``).

Example:
    >>> [lisa_state(s, align_steps=1, finetune_steps=3) for s in range(6)]
    ['align', 'finetune', 'finetune', 'finetune', 'align', 'finetune']
    >>> import torch
    >>> w = torch.nn.Parameter(torch.ones(2)); float(proximal_term([w], [torch.zeros(2)], rho=1.0))
    1.0
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj")


# ------------------------------------------------------------------------------------------------------ Lisa
def lisa_state(step: int, *, align_steps: int, finetune_steps: int) -> str:
    """``"align"`` or ``"finetune"``: the state of 0-based ``step`` in Lisa's cycle (alignment first)."""
    if align_steps < 0 or finetune_steps < 0 or align_steps + finetune_steps == 0:
        raise ValueError(f"need align_steps, finetune_steps >= 0 with a positive sum, got {align_steps}, "
                         f"{finetune_steps}")
    return "align" if step % (align_steps + finetune_steps) < align_steps else "finetune"


def proximal_term(params: Sequence[torch.Tensor], anchor: Sequence[torch.Tensor], rho: float) -> torch.Tensor:
    """``rho/2 * sum ||theta - anchor||^2`` (Lisa's proximal term)."""
    if rho < 0 or not math.isfinite(rho):
        raise ValueError(f"rho must be a finite number >= 0, got {rho}")
    # $$\frac{\rho}{2}\,\lVert \theta - \tilde\theta \rVert^2$$
    return rho / 2 * sum(((p - a) ** 2).sum() for p, a in zip(params, anchor, strict=True))


# ---------------------------------------------------------------------------------------------------- Vaccine
def attention_modules(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The self-attention blocks of a ``transformers`` decoder (modules whose class name ends in ``Attention``)."""
    mods = [m for m in model.modules() if type(m).__name__.endswith("Attention")]
    if not mods:
        raise TypeError(f"{type(model).__name__} has no attention modules for Vaccine's perturbation")
    return mods


@contextlib.contextmanager
def _hooks(modules: Sequence[torch.nn.Module], hook: Callable[..., Any]) -> Iterator[None]:
    handles = [m.register_forward_hook(hook) for m in modules]
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def vaccine_perturbations(model: torch.nn.Module, loss_fn: Callable[[torch.nn.Module], torch.Tensor], rho: float
                          ) -> dict[torch.nn.Module, torch.Tensor]:
    """Vaccine's perturbation of each attention block's output: ``rho * g_l / ||g||`` (global norm over blocks).

    ``g_l`` is the gradient of ``loss_fn(model)`` with respect to block l's output (no parameter gradient is
    kept).
    """
    if rho < 0 or not math.isfinite(rho):
        raise ValueError(f"rho must be a finite number >= 0, got {rho}")
    modules = attention_modules(model)
    outputs: dict[torch.nn.Module, torch.Tensor] = {}

    def record(module: torch.nn.Module, args: Any, output: Any) -> None:
        outputs[module] = output[0] if isinstance(output, tuple) else output

    with _hooks(modules, record):
        first = loss_fn(model)
    grads = torch.autograd.grad(first, [outputs[m] for m in modules], allow_unused=True)
    grads = [torch.zeros_like(outputs[m]) if g is None else g.detach() for m, g in zip(modules, grads, strict=True)]
    norm = torch.sqrt(sum((g**2).sum() for g in grads))
    # $$\epsilon_l = \rho\, g_l / \lVert g \rVert$$   (Vaccine: the worst-case embedding drift of radius rho)
    return {m: rho * g / (norm + 1e-7) for m, g in zip(modules, grads, strict=True)}


def vaccine_loss(model: torch.nn.Module, loss_fn: Callable[[torch.nn.Module], torch.Tensor], rho: float
                 ) -> torch.Tensor:
    """Vaccine's perturbation-aware loss (backward it: its gradient is the update direction).

    ``loss_fn(model)`` recomputed with :func:`vaccine_perturbations` added to the attention outputs.
    """
    eps = vaccine_perturbations(model, loss_fn, rho)

    def perturb(module: torch.nn.Module, args: Any, output: Any) -> Any:
        if isinstance(output, tuple):
            return (output[0] + eps[module], *output[1:])
        return output + eps[module]

    with _hooks(list(eps), perturb):
        return loss_fn(model)


# --------------------------------------------------------------------------------------------------- SafeLoRA
@torch.no_grad()
def safelora_project(model: torch.nn.Module, aligned: dict[str, torch.Tensor], unaligned: dict[str, torch.Tensor],
                     *, threshold: float = 0.5, targets: Sequence[str] = TARGET_MODULES) -> dict[str, float]:
    """Project fine-tuning updates of ``model`` (merged weights) onto the alignment subspace, in place.

    Args:
        model: the fine-tuned model (plain weights; merge LoRA first).
        aligned, unaligned: ``state_dict``s of the aligned model (the fine-tuning start) and of its unaligned
            (pretrained) ancestor.
        threshold: layers whose update has cosine similarity with its projection below this are projected.
        targets: weight names to consider (those containing one of these strings and ending in ``.weight``).

    Returns:
        ``{"projected": layers projected, "layers": layers considered}``.
    """
    if not 0.0 <= threshold <= 1.0:
        raise ValueError(f"threshold must be in [0, 1], got {threshold}")
    projected = considered = 0
    for name, w in model.named_parameters():
        if not name.endswith(".weight") or not any(t in name for t in targets):
            continue
        if name not in aligned or name not in unaligned:
            raise KeyError(f"{name} is missing from the aligned or unaligned state_dict")
        considered += 1
        a, u = aligned[name].to(torch.float64), unaligned[name].to(torch.float64)
        delta = w.detach().to(torch.float64) - a
        V = a - u
        vnorm = torch.linalg.norm(V)
        if vnorm == 0 or torch.linalg.norm(delta) == 0:
            continue
        # $$C = V V^\top / \lVert V \rVert_F$$
        C = V @ V.T / vnorm
        proj = C @ delta
        denom = torch.linalg.norm(delta) * torch.linalg.norm(proj)
        cos = float((delta * proj).sum() / denom) if denom > 0 else 0.0
        if cos < threshold:
            w.copy_((a + proj).to(w.dtype))
            projected += 1
    return {"projected": float(projected), "layers": float(considered)}
