"""Independent bit-level oracles for the float-network construction (tests only; no experiment imports this).

``verify.py`` compares outputs with IEEE equality and counts ulps; these check the same facts a second way, by
reinterpreting each float as the integer of its bit pattern (same width), so a test does not trust the code it
checks. The paper's claim is exact representation: for every point p, fl(net(p)) = v_p and the autodiff
gradient equals g_p bit for bit in the format (Hwang et al. 2026, arXiv:2605.01702, main theorem):

    same_bits(a, b)            <=>  bits(a_i) = bits(b_i)  or  a_i = b_i = 0   for every i   (+0 == -0)
    zero_sign_mismatch(a, t)_i <=>  a_i = 0  and  signbit(a_i) != signbit(t_i)

Example:
    >>> import torch
    >>> same_bits(torch.tensor([0.0, 1.5]), torch.tensor([-0.0, 1.5]))
    True
"""

from __future__ import annotations

import torch

#: the signed integer type of each format's width, to read a float's bit pattern
BIT_INT = {torch.float32: torch.int32, torch.float16: torch.int16, torch.bfloat16: torch.int16}


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit equality of two same-format tensors, with +0 == -0 (an independent check of verify's IEEE comparison).

    $$\\forall i:\\ \\mathrm{bits}(a_i) = \\mathrm{bits}(b_i) \\ \\lor\\ a_i = b_i = 0$$
    (exact representation in the format; Hwang et al. 2026, main theorem).
    """
    a, b = a.contiguous(), b.contiguous()
    zero = (a == 0) & (b == 0)
    return bool(((a.view(BIT_INT[a.dtype]) == b.view(BIT_INT[b.dtype])) | zero).all())


def zero_sign_mismatch(got: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Where a zero came back with the other sign than its target's: the signed-zero cases IEEE equality hides.

    $$m_i = [\\,got_i = 0\\,] \\wedge [\\,\\mathrm{signbit}(got_i) \\ne \\mathrm{signbit}(target_i)\\,]$$
    ``target`` is cast to ``got``'s format first.
    """
    return (got == 0) & (torch.signbit(got) != torch.signbit(target.to(got.dtype)))
