"""Slow, literal float64 transcriptions of Align-TI's loss terms (tests only; reconstruction, see ``loss.py``).

Every function loops over rows, positions and branches with plain Python/NumPy arithmetic (IVA on hidden states:
the projection and the cosine written out element by element), and TPA's reference runs the model once **per
branch** on the truncated sequence ``y_<k, y~_kj`` (no branch mask), which is what the one-pass mask must
reproduce.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch


def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    m = x.max()
    return x - m - np.log(np.exp(x - m).sum())


def kl(p_logits: np.ndarray, q_logits: np.ndarray, temperature: float = 1.0) -> float:
    """``KL(p || q) * T^2`` of two logit vectors at temperature ``T``."""
    lp, lq = (
        _log_softmax(np.asarray(p_logits) / temperature),
        _log_softmax(np.asarray(q_logits) / temperature),
    )
    return float(sum(np.exp(a) * (a - b) for a, b in zip(lp, lq, strict=True))) * temperature**2


def kd(
    student: np.ndarray,
    teacher: np.ndarray,
    mask: np.ndarray,
    temperature: float = 1.0,
    direction: str = "forward",
) -> float:
    """Mean over masked positions of the token KL; ``student``/``teacher`` ``(B, T, V)``."""
    total, n = 0.0, 0
    for b in range(student.shape[0]):
        for t in range(student.shape[1]):
            if mask[b, t]:
                p, q = (
                    (teacher[b, t], student[b, t])
                    if direction == "forward"
                    else (student[b, t], teacher[b, t])
                )
                total += kl(p, q, temperature)
                n += 1
    return total / max(n, 1)


def alpha(attn: np.ndarray, visual: np.ndarray, instruction: np.ndarray) -> np.ndarray:
    """Instruction-to-vision attention of each row ``(B, T)`` from ``attn`` ``(B, H, T, T)``."""
    b_, h_, t_, _ = attn.shape
    out = np.zeros((b_, t_))
    for b in range(b_):
        rows = [q for q in range(t_) if instruction[b, q]]
        cols = [i for i in range(t_) if visual[b, i]]
        if not rows:
            for i in cols:
                out[b, i] = 1.0 / len(cols)
            continue
        for i in cols:
            out[b, i] = sum(float(attn[b, h, q, i]) for h in range(h_) for q in rows) / (h_ * len(rows))
        s = out[b].sum()
        out[b] = out[b] / s
    return out


def irs(alpha_a: np.ndarray, alpha_b: np.ndarray) -> np.ndarray:
    """``1 - mean cos`` per layer, ``alpha_*`` ``(L, P, N)``."""
    out = []
    for layer in range(alpha_a.shape[0]):
        cos = [
            float(a @ b / np.sqrt((a @ a) * (b @ b)))
            for a, b in zip(alpha_a[layer], alpha_b[layer], strict=True)
        ]
        out.append(1.0 - sum(cos) / len(cos))
    return np.array(out)


def iva(student: np.ndarray, teacher: np.ndarray, weights: np.ndarray, temperature: float = 1.0) -> float:
    """``mean_b sum_i w_bi KL(p_T,i || p_S,i)``."""
    rows = []
    for b in range(student.shape[0]):
        rows.append(
            sum(
                weights[b, i] * kl(teacher[b, i], student[b, i], temperature)
                for i in range(student.shape[1])
                if weights[b, i] > 0
            )
        )
    return float(np.mean(rows))


def iva_hidden(
    student: np.ndarray, teacher: np.ndarray, weights: np.ndarray, projection: np.ndarray | None = None
) -> float:
    """``mean_b sum_i w_bi (1 - cos(P s_bi, t_bi))`` over the positions with a positive weight; ``student``
    ``(B, T, D_S)``, ``teacher`` ``(B, T, D_T)``, ``projection`` ``(D_T, D_S)`` (``None``: identity)."""
    rows = []
    for b in range(student.shape[0]):
        total = 0.0
        for i in range(student.shape[1]):
            if weights[b, i] <= 0:
                continue
            s = [float(x) for x in student[b, i]]
            if projection is not None:
                s = [sum(float(projection[r, c]) * s[c] for c in range(len(s))) for r in range(projection.shape[0])]
            t = [float(x) for x in teacher[b, i]]
            dot = sum(x * y for x, y in zip(s, t, strict=True))
            cos = dot / (np.sqrt(sum(x * x for x in s)) * np.sqrt(sum(y * y for y in t)))
            total += float(weights[b, i]) * (1.0 - cos)
        rows.append(total)
    return float(np.mean(rows))


@torch.no_grad()
def tpa_per_branch(
    student: Any,
    teacher: Any,
    batch: dict[str, torch.Tensor],
    positions: np.ndarray,
    valid: np.ndarray,
    tokens: np.ndarray,
    weights: np.ndarray,
    temperature: float = 1.0,
) -> float:
    """TPA by one forward per branch: row ``b``, position ``k``, alternative ``j`` runs the models on
    ``input_ids[b, :k] + [tokens[b, k, j]]`` (with the row's image) and compares the last positions."""
    per_k = []
    for b in range(positions.shape[0]):
        for r in range(positions.shape[1]):
            if not valid[b, r]:
                continue
            k = int(positions[b, r])
            total = 0.0
            for j in range(tokens.shape[2]):
                ids = torch.cat([batch["input_ids"][b, :k], torch.tensor([int(tokens[b, r, j])])])[None]
                extra = {"pixel_values": batch["pixel_values"][b : b + 1]} if "pixel_values" in batch else {}
                s = student(input_ids=ids, **extra).logits[0, -1].double().numpy()
                t = teacher(input_ids=ids, **extra).logits[0, -1].double().numpy()
                total += float(weights[b, r, j]) * kl(t, s, temperature)
            per_k.append(total)
    return float(np.mean(per_k)) if per_k else 0.0
