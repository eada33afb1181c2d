"""Align-TI's losses: vanilla KD, IVA (instruction-aware vision alignment), TPA (transition probability alignment).

The objective (the four terms the ICLR 2026 reviews list; weights unknown, 1 each by default)::

    L = w_sft L_sft + w_kd L_kd + w_iva L_iva + w_tpa L_tpa

- ``L_kd``: token-level KL between teacher and student next-token distributions on the ground-truth response
  (forward ``KL(p_T || p_S)`` by default; the paper's Eqs. 2 and 5 disagree on the direction, so it is an option).
- ``L_iva`` (**reconstruction**): ``sum_i w_i (1 - cos(P h^S_s(i), h^T_l*(i)))`` over the visual positions ``i``:
  the teacher's hidden state at the input of layer ``l*`` (the visual tokens whose keys and values ``l*``'s
  instruction attention reads) and the student's at the input of its layer ``s`` (the same relative depth,
  ``s = floor(l* L_S / L_T)``), through a learned linear projection ``P`` (student width to teacher width,
  initialised to the identity embedding); ``w_i`` is the teacher's attention from the instruction tokens to visual
  token ``i`` at ``l*`` (mean over heads and instruction tokens, renormalised over ``i``); ``l*`` maximises the
  instruction-relevance score ``IRS(l) = 1 - E cos(alpha_l(x1), alpha_l(x2))`` over pairs with the same image and
  different instructions. ``iva_target="logits"`` is the earlier reading, ``sum_i w_i KL(p_T,i || p_S,i)`` of the
  LM-head distributions at the visual positions: outputs no training stage ever fits (issue #54).
- ``L_tpa`` (**reconstruction**): at every response position ``k`` the student proposes ``m`` alternatives
  ``y~`` to the ground-truth token (its top-``m`` other tokens, or sampled; no gradient), and the teacher's and
  the student's *next-step* distributions after the alternative are aligned,
  ``sum_j a_kj KL(p_T(. | y_<k, y~_kj, x) || p_S(. | y_<k, y~_kj, x))``; all ``(k, j)`` branches are evaluated
  in one forward pass with a branch ("ribbon") attention mask (``build_branch_attention_mask``): a branch token
  at position ``k`` attends to the prefix ``< k`` and to itself and carries position id ``k``.

The paper's training code is not released: IVA and TPA here are reconstructions from the paper's description
and its public reviews (design notes), not the authors' code.

Example:
    >>> import torch
    >>> s, t = torch.randn(2, 5, 7), torch.randn(2, 5, 7)
    >>> mask = torch.ones(2, 5, dtype=torch.bool)
    >>> round(float(kd_divergence(s, s, mask)), 6)
    0.0
    >>> build_branch_attention_mask(prefix_len=2, response_len=2, n_alt=1).int().tolist()
    [[1, 0, 0, 0, 0, 0], [1, 1, 0, 0, 0, 0], [1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 0, 0], [1, 1, 0, 0, 1, 0], [1, 1, 1, 0, 0, 1]]

Reference: Chen et al., "Beyond Next-Token Alignment: Distilling Multimodal Large Language Models via Token
Interactions", ICML 2026, arXiv:2602.09483.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

IGNORE_INDEX = -100
DIRECTIONS = ("forward", "reverse")
SAMPLINGS = ("topk", "sample")
IVA_TARGETS = ("hidden", "logits")


# ---------------------------------------------------------------------------------------------------- checks
def _check_finite(name: str, x: torch.Tensor) -> None:
    if not torch.isfinite(x).all():
        raise ValueError(f"{name} contains NaN or Inf")


def _up(x: torch.Tensor) -> torch.Tensor:
    """float32 for half precisions, the tensor itself for float32/float64 (so float64 gradient checks work)."""
    return x if x.dtype in (torch.float32, torch.float64) else x.float()


def _check_vocab(student_logits: torch.Tensor, teacher_logits: torch.Tensor) -> None:
    if student_logits.shape[-1] != teacher_logits.shape[-1]:
        raise ValueError(
            f"teacher and student must share a vocabulary: student_logits has {student_logits.shape[-1]} "
            f"classes, teacher_logits {teacher_logits.shape[-1]}"
        )
    if student_logits.shape[:-1] != teacher_logits.shape[:-1]:
        raise ValueError(
            f"student_logits {tuple(student_logits.shape)} and teacher_logits "
            f"{tuple(teacher_logits.shape)} must have the same shape"
        )


def token_kl(
    student_logits: torch.Tensor,
    teacher_logits: torch.Tensor,
    *,
    temperature: float = 1.0,
    direction: str = "forward",
) -> torch.Tensor:
    """Per-position KL between the two softmax distributions at ``temperature``, times ``temperature**2``.

    ``direction="forward"``: ``KL(p_T || p_S) = sum_v p_T(v) (log p_T(v) - log p_S(v))``; ``"reverse"``:
    ``KL(p_S || p_T)``. Shape: the logits' without the last axis.
    """
    if direction not in DIRECTIONS:
        raise ValueError(f"direction must be one of {DIRECTIONS}, got {direction!r}")
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    _check_vocab(student_logits, teacher_logits)
    log_s = F.log_softmax(_up(student_logits) / temperature, dim=-1)
    log_t = F.log_softmax(_up(teacher_logits) / temperature, dim=-1)
    if direction == "forward":
        # $$KL(p_T \| p_S) = \sum_v p_T(v) (\log p_T(v) - \log p_S(v))$$
        kl = (log_t.exp() * (log_t - log_s)).sum(-1)
    else:
        kl = (log_s.exp() * (log_s - log_t)).sum(-1)
    return kl * temperature**2


def kd_divergence(
    student_logits: torch.Tensor,
    teacher_logits: torch.Tensor,
    mask: torch.Tensor,
    *,
    temperature: float = 1.0,
    direction: str = "forward",
) -> torch.Tensor:
    """Vanilla KD: mean over the masked positions of ``token_kl`` (0 when nothing is masked in).

    Args:
        student_logits, teacher_logits: ``(..., V)`` next-token logits, aligned position by position.
        mask: bool ``(...)``: the positions that count (response tokens).
        temperature: softmax temperature (Hinton; the loss is scaled by ``temperature**2``).
        direction: ``"forward"`` (``KL(p_T || p_S)``, default) or ``"reverse"``.
    Returns:
        a scalar.
    """
    if mask.shape != student_logits.shape[:-1]:
        raise ValueError(
            f"mask {tuple(mask.shape)} must match the logits' leading shape {tuple(student_logits.shape[:-1])}"
        )
    kl = token_kl(student_logits, teacher_logits, temperature=temperature, direction=direction)
    mask = mask.bool()
    return (kl * mask).sum() / mask.sum().clamp(min=1)


# ----------------------------------------------------------------------------------------------------- IVA
def instruction_vision_attention(
    attn: torch.Tensor, visual_mask: torch.Tensor, instruction_mask: torch.Tensor
) -> torch.Tensor:
    """``alpha``: attention from the instruction tokens to each visual token, mean over heads and instruction
    rows, renormalised over the visual tokens.

    Args:
        attn: ``(B, H, T, T)`` attention probabilities of one layer (rows: queries).
        visual_mask, instruction_mask: bool ``(B, T)``.
    Returns:
        ``(B, T)`` weights, zero off the visual positions, summing to 1 over them (uniform for a row without
        instruction tokens).
    """
    if attn.ndim != 4 or attn.shape[-1] != attn.shape[-2] or attn.shape[-1] != visual_mask.shape[-1]:
        raise ValueError(
            f"attn must be (B, H, T, T) with T = {visual_mask.shape[-1]}, got {tuple(attn.shape)}"
        )
    vis = visual_mask.bool()
    inst = instruction_mask.to(attn.dtype)
    # $$\alpha_i = \frac{1}{H |I|} \sum_h \sum_{q \in I} A^{(l)}_{h,q,i}$$
    a = (attn.mean(1) * inst[:, :, None]).sum(1) / inst.sum(1, keepdim=True).clamp(min=1)
    a = a * vis
    total = a.sum(-1, keepdim=True)
    uniform = vis.to(attn.dtype) / vis.sum(-1, keepdim=True).clamp(min=1)
    return torch.where(total > 0, a / total.clamp(min=torch.finfo(attn.dtype).tiny), uniform)


def irs_from_alphas(alpha_a: torch.Tensor, alpha_b: torch.Tensor) -> torch.Tensor:
    """Instruction-relevance score per layer: ``IRS(l) = 1 - mean_pairs cos(alpha_l(x1), alpha_l(x2))``.

    ``alpha_a``, ``alpha_b``: ``(L, P, N)`` instruction-to-vision attention of ``P`` pairs (same image, different
    instruction) at ``L`` layers over ``N`` visual tokens. Returns ``(L,)``.
    """
    if alpha_a.shape != alpha_b.shape or alpha_a.ndim != 3:
        raise ValueError(
            f"alpha_a and alpha_b must both be (L, P, N), got {tuple(alpha_a.shape)} and "
            f"{tuple(alpha_b.shape)}"
        )
    # $$IRS(l) = 1 - E_{x_1, x_2}[\cos(\alpha^{(l)}(x_1), \alpha^{(l)}(x_2))]$$
    return 1.0 - F.cosine_similarity(alpha_a, alpha_b, dim=-1).mean(-1)


def response_mask_of(batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """``(B, T)`` bool: tokens of the response (``labels != -100``)."""
    return batch["labels"] != IGNORE_INDEX


def segments(batch: dict[str, torch.Tensor], image_token_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(visual, instruction)`` bool ``(B, T)`` masks: image tokens, and the non-image prompt tokens after the
    first one (BOS), outside the response and the padding."""
    ids = batch["input_ids"]
    valid = (
        batch["attention_mask"].bool()
        if "attention_mask" in batch
        else torch.ones_like(ids, dtype=torch.bool)
    )
    visual = ids == image_token_id
    answer = response_mask_of(batch) if "labels" in batch else torch.zeros_like(visual)
    not_first = torch.arange(ids.shape[1], device=ids.device)[None, :] > 0
    return visual & valid, valid & ~visual & ~answer & not_first


@torch.no_grad()
def instruction_relevance_scores(model: Any, pairs: Any, image_token_id: int) -> torch.Tensor:
    """IRS of every language-model layer of ``model`` over calibration pairs (eager attention needed).

    Args:
        model: a LLaVA-style model whose forward accepts ``output_attentions=True``.
        pairs: iterable of ``(batch_a, batch_b)``: row ``r`` of both shows the same image with different
            instructions (``encode`` output; labels optional).
        image_token_id: the id of the image placeholder token.
    Returns:
        ``(L,)``; ``argmax`` is IVA's layer ``l*``.
    """
    model.eval()
    alphas: list[tuple[torch.Tensor, torch.Tensor]] = []
    for batch_a, batch_b in pairs:
        per = []
        for batch in (batch_a, batch_b):
            out = model(**{k: v for k, v in batch.items() if k != "labels"}, output_attentions=True)
            if not out.attentions or out.attentions[0] is None:
                raise ValueError(
                    "the model returned no attention maps: load it with attn_implementation='eager'"
                )
            vis, inst = segments(batch, image_token_id)
            per.append(
                torch.stack(
                    [
                        instruction_vision_attention(a, vis, inst)[vis].view(vis.shape[0], -1)
                        for a in out.attentions
                    ]
                )
            )
        alphas.append((per[0], per[1]))
    if not alphas:
        raise ValueError("pairs is empty")
    return irs_from_alphas(torch.cat([a for a, _ in alphas], 1), torch.cat([b for _, b in alphas], 1))


def _iva_weights(weights: torch.Tensor, topk: int | None) -> torch.Tensor:
    """IVA's visual-token weights, checked; with ``topk``, each row's ``topk`` largest kept and renormalised."""
    if (weights < 0).any():
        raise ValueError("weights must be non-negative")
    w = weights
    if topk is not None:
        if topk < 1:
            raise ValueError(f"topk must be >= 1, got {topk}")
        keep = torch.zeros_like(w, dtype=torch.bool).scatter_(
            -1, w.topk(min(topk, w.shape[-1]), -1).indices, True
        )
        w = torch.where(keep, w, torch.zeros_like(w))
        w = w / w.sum(-1, keepdim=True).clamp(min=torch.finfo(w.dtype).tiny)
    return w


def iva_divergence(
    student_logits: torch.Tensor,
    teacher_logits: torch.Tensor,
    weights: torch.Tensor,
    *,
    temperature: float = 1.0,
    direction: str = "forward",
    topk: int | None = None,
) -> torch.Tensor:
    """IVA on the LM head (``iva_target="logits"``): ``mean_b sum_i w_bi KL(p_T,i || p_S,i)`` over visual positions.

    The earlier reconstruction, kept as an option: at the image positions the LM head's outputs are fitted by no
    training stage (the next token after an image token is never a target), so this aligns untrained outputs;
    ``iva_hidden_divergence`` is the default.

    Args:
        student_logits, teacher_logits: ``(B, T, V)`` LM-head logits at every position.
        weights: ``(B, T)`` non-negative, zero off the visual positions (``instruction_vision_attention``).
        topk: keep only each row's ``topk`` largest weights (hard salient tokens), renormalised.
    """
    if weights.shape != student_logits.shape[:-1]:
        raise ValueError(
            f"weights {tuple(weights.shape)} must match the logits' leading shape "
            f"{tuple(student_logits.shape[:-1])}"
        )
    w = _iva_weights(weights, topk)
    kl = token_kl(student_logits, teacher_logits, temperature=temperature, direction=direction)
    # $$L_{iva} = \sum_i w_i \, KL(p_T(\cdot | x_{\le i}) \| p_S(\cdot | x_{\le i}))$$
    return (w.to(kl.dtype) * kl).sum(-1).mean()


def iva_hidden_divergence(
    student_hidden: torch.Tensor,
    teacher_hidden: torch.Tensor,
    weights: torch.Tensor,
    projection: torch.Tensor | None = None,
    *,
    topk: int | None = None,
) -> torch.Tensor:
    """IVA on hidden states (the default): ``mean_b sum_i w_bi (1 - cos(P s_bi, t_bi))`` (reconstruction).

    Cosine distance, so the term is scale-free (the residual stream's norm grows with depth and training) and
    bounded: at most 2 per row, since the weights sum to 1 over the visual tokens.

    Args:
        student_hidden: ``(B, T, D_S)`` the student's hidden states (input of its layer ``s``).
        teacher_hidden: ``(B, T, D_T)`` the teacher's (input of its layer ``l*``).
        weights: ``(B, T)`` non-negative, zero off the visual positions (``instruction_vision_attention``).
        projection: ``(D_T, D_S)`` matrix ``P`` applied to the student's states (``None``: the identity, equal
            widths).
        topk: keep only each row's ``topk`` largest weights (hard salient tokens), renormalised.
    Returns:
        a scalar.
    """
    if student_hidden.ndim != 3 or teacher_hidden.ndim != 3 or student_hidden.shape[:2] != teacher_hidden.shape[:2]:
        raise ValueError(
            f"student_hidden {tuple(student_hidden.shape)} and teacher_hidden {tuple(teacher_hidden.shape)} must "
            f"be (B, T, D) with the same B and T"
        )
    if weights.shape != student_hidden.shape[:2]:
        raise ValueError(
            f"weights {tuple(weights.shape)} must match the hidden states' (B, T) {tuple(student_hidden.shape[:2])}"
        )
    s = _up(student_hidden)
    if projection is None:
        if student_hidden.shape[-1] != teacher_hidden.shape[-1]:
            raise ValueError(
                f"the widths differ (student {student_hidden.shape[-1]}, teacher {teacher_hidden.shape[-1]}): "
                f"give a projection"
            )
    else:
        if projection.shape != (teacher_hidden.shape[-1], student_hidden.shape[-1]):
            raise ValueError(
                f"projection must be (teacher width, student width) = "
                f"{(teacher_hidden.shape[-1], student_hidden.shape[-1])}, got {tuple(projection.shape)}"
            )
        # $$\hat h_i = P \, h^S_s(i)$$
        s = F.linear(s, projection.to(s.dtype))
    t = _up(teacher_hidden).to(s.dtype)
    w = _iva_weights(weights, topk)
    # $$L_{iva} = \sum_i w_i \, (1 - \cos(P h^S_s(i), h^T_{l^*}(i)))$$
    dist = 1.0 - F.cosine_similarity(s, t, dim=-1)
    return (w.to(dist.dtype) * dist).sum(-1).mean()


def student_layer_for(iva_layer: int, teacher_layers: int, student_layers: int) -> int:
    """The student layer ``s`` whose input IVA aligns with the input of teacher layer ``l*``: the same relative
    depth, ``floor(l* L_S / L_T)`` (0 for 0; always a layer whose input a later layer reads).

    Example:
        >>> [student_layer_for(l, 4, 2) for l in range(4)]
        [0, 0, 1, 1]
    """
    if not 0 <= iva_layer < teacher_layers or student_layers < 1:
        raise ValueError(
            f"iva_layer must be in 0..{teacher_layers - 1} and student_layers >= 1, got {iva_layer}, "
            f"{student_layers}"
        )
    return iva_layer * student_layers // teacher_layers


# ----------------------------------------------------------------------------------------------------- TPA
def build_branch_attention_mask(prefix_len: int, response_len: int, n_alt: int) -> torch.Tensor:
    """Bool attention mask (True = may attend) of one sequence with its TPA branches, for one forward pass.

    The sequence is ``prefix_len + response_len`` tokens (causal), followed by ``response_len * n_alt`` branch
    tokens, ordered by response position ``k`` then alternative ``j``: the branch for ``(k, j)`` replaces the
    response token at ``prefix_len + k``, so it attends to the tokens before it and to itself only.

    Returns:
        ``(N, N)`` with ``N = prefix_len + response_len * (1 + n_alt)``.
    """
    if n_alt < 1:
        raise ValueError(f"n_alt (the branch count) must be >= 1, got {n_alt}")
    if prefix_len < 1 or response_len < 0:
        raise ValueError(f"prefix_len must be >= 1 and response_len >= 0, got {prefix_len}, {response_len}")
    t = prefix_len + response_len
    pos = torch.arange(prefix_len, t).repeat_interleave(n_alt)
    return _branch_mask(torch.ones(1, t, dtype=torch.bool), pos[None])[0]


def _branch_mask(
    valid: torch.Tensor, branch_pos: torch.Tensor, branch_valid: torch.Tensor | None = None
) -> torch.Tensor:
    """``(B, T + M, T + M)`` bool: causal over the ``T`` tokens (keys restricted to ``valid``), and branch ``r``
    at position ``branch_pos[:, r]`` attending to keys ``< branch_pos`` and itself. Every row attends at least to
    itself (no empty softmax)."""
    b, t = valid.shape
    m = branch_pos.shape[1]
    n = t + m
    mask = torch.zeros(b, n, n, dtype=torch.bool, device=valid.device)
    causal = torch.ones(t, t, dtype=torch.bool, device=valid.device).tril()
    mask[:, :t, :t] = causal[None] & valid[:, None, :]
    keys = torch.arange(t, device=valid.device)
    prefix = (keys[None, None, :] < branch_pos[:, :, None]) & valid[:, None, :]
    if branch_valid is not None:
        prefix = prefix & branch_valid[:, :, None]
    mask[:, t:, :t] = prefix
    eye = torch.eye(n, dtype=torch.bool, device=valid.device)
    return mask | eye[None]


def additive_mask(mask: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``(B, 1, N, N)`` additive float mask (0 where allowed, the dtype's minimum elsewhere), the form HF
    decoders take as a custom 4D ``attention_mask`` (a bool 4D mask would be *added* as 0/1 in eager attention)."""
    out = torch.zeros(mask.shape, dtype=dtype, device=mask.device)
    out.masked_fill_(~mask, torch.finfo(dtype).min)
    return out[:, None]


@dataclass
class Branches:
    """TPA's branches for one batch: ``K`` response positions per row, ``m`` alternatives each."""

    positions: torch.Tensor
    """``(B, K)`` long: the sequence position ``k`` each branch token replaces (a response token)"""
    valid: torch.Tensor
    """``(B, K)`` bool: real positions (rows with fewer response tokens are padded)"""
    tokens: torch.Tensor
    """``(B, K, m)`` long: the alternative tokens"""
    weights: torch.Tensor
    """``(B, K, m)``: branch weights, summing to 1 over ``m`` at valid positions"""


def response_positions(labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(positions (B, K), valid (B, K))`` of the response tokens (``labels != -100``), left-aligned."""
    resp = labels != IGNORE_INDEX
    k = int(resp.sum(1).max()) if resp.numel() else 0
    order = torch.argsort((~resp).to(torch.int8), dim=1, stable=True)[:, :k]
    valid = torch.gather(resp, 1, order)
    return order, valid


@torch.no_grad()
def propose_alternatives(
    student_logits: torch.Tensor,
    labels: torch.Tensor,
    n_alt: int,
    *,
    sampling: str = "topk",
    weighting: str = "student",
    generator: torch.Generator | None = None,
    exclude: tuple[int, ...] = (),
) -> Branches:
    """The student's ``n_alt`` alternatives to each ground-truth response token (no gradient).

    Args:
        student_logits: ``(B, T, V)`` from the plain forward: ``student_logits[:, k-1]`` is the student's
            distribution of token ``k`` given the true prefix.
        labels: ``(B, T)`` with -100 off the response.
        n_alt: alternatives per position (the branch count, >= 1; at most ``V - 1``).
        sampling: ``"topk"`` (the student's ``n_alt`` most likely tokens other than the true one) or ``"sample"``
            (drawn without replacement from the student's distribution with the true token removed).
        weighting: ``"student"`` (student probabilities renormalised over the alternatives) or ``"uniform"``.
        exclude: token ids never proposed (the image placeholder: a LLaVA model counts them against its image
            features; padding).
    """
    if n_alt < 1:
        raise ValueError(f"n_alt (the branch count) must be >= 1, got {n_alt}")
    if n_alt >= student_logits.shape[-1]:
        raise ValueError(f"n_alt must be below the vocabulary size {student_logits.shape[-1]}, got {n_alt}")
    if sampling not in SAMPLINGS:
        raise ValueError(f"sampling must be one of {SAMPLINGS}, got {sampling!r}")
    if weighting not in ("student", "uniform"):
        raise ValueError(f"weighting must be 'student' or 'uniform', got {weighting!r}")
    positions, valid = response_positions(labels)
    if (positions[valid] == 0).any():
        raise ValueError("a response token at position 0 has no prefix")
    prev = (positions - 1).clamp(min=0)
    logits = torch.gather(student_logits, 1, prev[..., None].expand(-1, -1, student_logits.shape[-1])).float()
    truth = torch.gather(labels, 1, positions).clamp(min=0)
    logits = logits.scatter(-1, truth[..., None], float("-inf"))
    if exclude:
        logits[..., list(exclude)] = float("-inf")
    probs = logits.softmax(-1)
    if sampling == "topk":
        tokens = probs.topk(n_alt, -1).indices
    else:
        flat = probs.reshape(-1, probs.shape[-1])
        tokens = torch.multinomial(flat, n_alt, replacement=False, generator=generator).view(
            *probs.shape[:2], n_alt
        )
    if weighting == "uniform":
        weights = torch.full(tokens.shape, 1.0 / n_alt)
    else:
        p = torch.gather(probs, -1, tokens)
        weights = p / p.sum(-1, keepdim=True).clamp(min=torch.finfo(p.dtype).tiny)
    return Branches(positions, valid, tokens, weights.to(student_logits.dtype))


def extend_with_branches(batch: dict[str, torch.Tensor], branches: Branches) -> dict[str, torch.Tensor]:
    """The model inputs of one forward pass over the sequence and all its branches.

    ``input_ids`` gains ``K * m`` branch tokens per row, ``position_ids`` give each the position it replaces,
    and ``attention_mask`` becomes the additive 4D branch mask (``_branch_mask``). Other keys (``pixel_values``)
    are kept; ``labels`` is dropped.
    """
    ids = batch["input_ids"]
    b, t = ids.shape
    k, m = branches.tokens.shape[1:]
    valid = (
        batch["attention_mask"].bool()
        if "attention_mask" in batch
        else torch.ones_like(ids, dtype=torch.bool)
    )
    bpos = branches.positions.repeat_interleave(m, 1)
    bvalid = branches.valid.repeat_interleave(m, 1)
    mask = _branch_mask(valid, bpos, bvalid)
    out = {key: v for key, v in batch.items() if key not in ("input_ids", "attention_mask", "labels")}
    out["input_ids"] = torch.cat([ids, branches.tokens.reshape(b, k * m)], 1)
    out["attention_mask"] = additive_mask(mask)
    out["position_ids"] = torch.cat([torch.arange(t, device=ids.device).expand(b, t), bpos], 1)
    return out


def tpa_divergence(
    student_branch_logits: torch.Tensor,
    teacher_branch_logits: torch.Tensor,
    branches: Branches,
    *,
    temperature: float = 1.0,
    direction: str = "forward",
) -> torch.Tensor:
    """TPA: ``mean over valid k of sum_j a_kj KL(p_T(. | y_<k, y~_kj) || p_S(. | y_<k, y~_kj))`` (reconstruction).

    ``*_branch_logits``: ``(B, K, m, V)``, the logits at the branch tokens.
    """
    kl = token_kl(student_branch_logits, teacher_branch_logits, temperature=temperature, direction=direction)
    # $$L_{tpa} = \frac{1}{|K|} \sum_k \sum_j a_{kj} KL(p_T(\cdot | y_{<k}, \tilde y_{kj}, x) \| p_S(\cdot | \ldots))$$
    per_k = (branches.weights.to(kl.dtype) * kl).sum(-1)
    valid = branches.valid
    return (per_k * valid).sum() / valid.sum().clamp(min=1)


def branch_logits(logits: torch.Tensor, seq_len: int, branches: Branches) -> torch.Tensor:
    """``(B, K, m, V)``: the logits of the branch tokens of an extended forward (``extend_with_branches``)."""
    b = logits.shape[0]
    k, m = branches.tokens.shape[1:]
    return logits[:, seq_len:].reshape(b, k, m, logits.shape[-1])


# ------------------------------------------------------------------------------------------------ the module
class AlignTILoss(nn.Module):
    """Align-TI's objective ``L = w_sft L_sft + w_kd L_kd + w_iva L_iva + w_tpa L_tpa`` for LLaVA-style models.

    The student runs once without gradient to propose TPA's alternatives, then once (with gradient) over the
    sequence *and* all branches with the branch mask (the sequence positions of that pass are exactly the plain
    forward's, since no sequence token attends to a branch); the teacher runs once, no gradient, over the same
    extended inputs, keeping layer ``l*``'s attention map and the input of layer ``l*`` when IVA is on (only that
    layer's; the student's layer-``s`` input comes from the same pass). With ``tpa_weight = 0`` both run once,
    plainly. IVA and TPA are reconstructions (module docstring).

    IVA's projection ``P`` (``iva_projection``, an ``nn.Linear`` from ``student_width`` to ``teacher_width``
    without bias, initialised to ``eye(teacher_width, student_width)``) is a parameter of this module, trained with
    the student (pass ``loss.parameters()`` to the optimiser; ``AlignTITrainer`` does) and not part of the student
    (the FitNets regressor's role).

    Args:
        sft_weight, kd_weight, iva_weight, tpa_weight: the terms' weights (unknown in the paper; 1 each).
        temperature: KD temperature for every KL term.
        kd_direction: ``"forward"`` (``KL(p_T || p_S)``) or ``"reverse"``, for every KL term.
        iva_layer: the teacher layer whose attention weights IVA and whose input IVA aligns (``l*``, e.g. from
            ``instruction_relevance_scores(...).argmax()``); required when ``iva_weight > 0``.
        iva_topk: keep only the ``iva_topk`` most attended visual tokens (``None``: soft weights).
        iva_target: ``"hidden"`` (hidden states through ``P``, cosine distance; default) or ``"logits"`` (KL of the
            LM-head distributions at the image positions, the earlier reading, which no stage trains).
        iva_student_layer: the student layer whose input is aligned (``None``: ``student_layer_for``, the same
            relative depth as ``l*``).
        student_width, teacher_width: the models' hidden sizes (``P``'s shape); required when ``iva_weight > 0``
            and ``iva_target="hidden"``.
        tpa_num_alternatives: branches per response position (``m``).
        tpa_sampling: ``"topk"`` or ``"sample"`` (``propose_alternatives``).
        tpa_weighting: ``"student"`` or ``"uniform"``.
        image_token_id: the image placeholder id (for IVA's segments); required when ``iva_weight > 0``.

    Example:
        >>> import numpy as np
        >>> from icml26.common.tiny_vlm import SceneSpec, VLMSpec, encode, make_items, sample_scenes, tiny_vlm, vlm_tokenizer
        >>> tok, scenes = vlm_tokenizer(), SceneSpec(grid=2)
        >>> teacher = tiny_vlm(tok, VLMSpec(hidden=64, layers=2), scenes, seed=0)
        >>> student = tiny_vlm(tok, VLMSpec(hidden=32, layers=1), scenes, seed=1)
        >>> rng = np.random.default_rng(0); attrs = sample_scenes(scenes, rng, 2)
        >>> batch = encode(tok, make_items(scenes, attrs, rng, "patch"), scenes, attrs, rng)
        >>> loss = AlignTILoss(iva_layer=1, image_token_id=tok.convert_tokens_to_ids("<image>"),
        ...                    student_width=32, teacher_width=64)
        >>> out = loss(student, teacher, batch)
        >>> sorted(out), bool(out["loss"] > 0)
        (['iva', 'kd', 'loss', 'sft', 'tpa'], True)
    """

    def __init__(
        self,
        sft_weight: float = 1.0,
        kd_weight: float = 1.0,
        iva_weight: float = 1.0,
        tpa_weight: float = 1.0,
        temperature: float = 1.0,
        kd_direction: str = "forward",
        iva_layer: int | None = None,
        iva_topk: int | None = None,
        tpa_num_alternatives: int = 4,
        tpa_sampling: str = "topk",
        tpa_weighting: str = "student",
        image_token_id: int | None = None,
        iva_target: str = "hidden",
        iva_student_layer: int | None = None,
        student_width: int | None = None,
        teacher_width: int | None = None,
    ) -> None:
        super().__init__()
        for name, w in (
            ("sft_weight", sft_weight),
            ("kd_weight", kd_weight),
            ("iva_weight", iva_weight),
            ("tpa_weight", tpa_weight),
        ):
            if not (w >= 0 and w < float("inf")):
                raise ValueError(f"{name} must be finite and >= 0, got {w}")
        if kd_direction not in DIRECTIONS:
            raise ValueError(f"kd_direction must be one of {DIRECTIONS}, got {kd_direction!r}")
        if not temperature > 0:
            raise ValueError(f"temperature must be > 0, got {temperature}")
        if tpa_num_alternatives < 1:
            raise ValueError(
                f"tpa_num_alternatives (the branch count) must be >= 1, got {tpa_num_alternatives}"
            )
        if tpa_sampling not in SAMPLINGS:
            raise ValueError(f"tpa_sampling must be one of {SAMPLINGS}, got {tpa_sampling!r}")
        if iva_weight > 0 and (iva_layer is None or image_token_id is None):
            raise ValueError("iva_layer and image_token_id are required when iva_weight > 0")
        if iva_layer is not None and iva_layer < 0:
            raise ValueError(f"iva_layer must be >= 0, got {iva_layer}")
        if iva_topk is not None and iva_topk < 1:
            raise ValueError(f"iva_topk must be >= 1, got {iva_topk}")
        if iva_target not in IVA_TARGETS:
            raise ValueError(f"iva_target must be one of {IVA_TARGETS}, got {iva_target!r}")
        if iva_student_layer is not None and iva_student_layer < 0:
            raise ValueError(f"iva_student_layer must be >= 0, got {iva_student_layer}")
        self.iva_projection: nn.Linear | None = None
        if iva_weight > 0 and iva_target == "hidden":
            for name, width in (("student_width", student_width), ("teacher_width", teacher_width)):
                if isinstance(width, bool) or not isinstance(width, int) or width < 1:
                    raise ValueError(
                        f"{name} (a model's hidden size, the shape of IVA's projection) must be an int >= 1 when "
                        f"iva_weight > 0 and iva_target='hidden', got {width!r}"
                    )
            # skip_init: no draw from the global random state (the identity start needs none)
            self.iva_projection = nn.utils.skip_init(nn.Linear, student_width, teacher_width, bias=False)
            with torch.no_grad():
                self.iva_projection.weight.copy_(torch.eye(teacher_width, student_width))
        self.iva_target, self.iva_student_layer = iva_target, iva_student_layer
        self.sft_weight, self.kd_weight, self.iva_weight, self.tpa_weight = (
            sft_weight,
            kd_weight,
            iva_weight,
            tpa_weight,
        )
        self.temperature, self.kd_direction = temperature, kd_direction
        self.iva_layer, self.iva_topk, self.image_token_id = iva_layer, iva_topk, image_token_id
        self.tpa_num_alternatives, self.tpa_sampling, self.tpa_weighting = (
            tpa_num_alternatives,
            tpa_sampling,
            tpa_weighting,
        )

    def forward(
        self,
        student: Any,
        teacher: Any,
        batch: dict[str, torch.Tensor],
        generator: torch.Generator | None = None,
        return_logits: bool = False,
    ) -> dict[str, torch.Tensor]:
        """``{"loss", "sft", "kd", "iva", "tpa"}`` (scalars; ``loss`` carries the student's gradient).

        ``batch``: LLaVA inputs with ``labels`` (-100 off the response), e.g. ``tiny_vlm.encode``.
        ``return_logits``: also return ``"logits"``, the student's ``(B, T, V)`` logits at the sequence positions
        (detached; what ``Trainer.predict`` collects).
        """
        if "labels" not in batch:
            raise ValueError("batch must hold labels (-100 off the response)")
        s_vocab = student.get_output_embeddings().weight.shape[0]
        t_vocab = teacher.get_output_embeddings().weight.shape[0]
        if s_vocab != t_vocab:
            raise ValueError(
                f"teacher and student must share a vocabulary: the student has {s_vocab} tokens, "
                f"the teacher {t_vocab}"
            )
        use_iva = self.iva_weight > 0
        hidden_iva = use_iva and self.iva_target == "hidden"
        s_layer = None
        if use_iva:
            n_layers = len(_decoder_layers(teacher))
            if not 0 <= self.iva_layer < n_layers:
                raise ValueError(
                    f"iva_layer must be in 0..{n_layers - 1} (the teacher's layers), got {self.iva_layer}"
                )
        if hidden_iva:
            n_student = len(_decoder_layers(student))
            s_layer = (
                student_layer_for(self.iva_layer, n_layers, n_student)
                if self.iva_student_layer is None
                else self.iva_student_layer
            )
            if not 0 <= s_layer < n_student:
                raise ValueError(
                    f"iva_student_layer must be in 0..{n_student - 1} (the student's layers), got {s_layer}"
                )
        inputs = {k: v for k, v in batch.items() if k != "labels"}
        labels = batch["labels"]
        t_len = labels.shape[1]
        branches = None
        if self.tpa_weight > 0:
            with torch.no_grad():
                was = student.training
                plain = student(**inputs).logits
                student.train(was)
            branches = propose_alternatives(
                plain,
                labels,
                self.tpa_num_alternatives,
                sampling=self.tpa_sampling,
                weighting=self.tpa_weighting,
                generator=generator,
                exclude=_special_ids(student, self.image_token_id),
            )
            inputs = extend_with_branches(batch, branches)
        with _layer_input(student, s_layer) as s_hidden:
            s_logits = student(**inputs).logits
        _check_finite("student logits", s_logits)
        teacher.eval()
        with torch.no_grad(), _layer_input(teacher, self.iva_layer if hidden_iva else None) as t_hidden:
            if use_iva:
                # only layer l*'s attention map is kept (a hook on its attention module), not every layer's
                t_out, attn = _forward_with_attention(teacher, inputs, self.iva_layer)
            else:
                t_out, attn = teacher(**inputs), None
        t_logits = t_out.logits
        _check_finite("teacher logits", t_logits)
        if s_logits.shape[-1] != t_logits.shape[-1]:
            raise ValueError(
                f"teacher and student must share a vocabulary: {s_logits.shape[-1]} vs {t_logits.shape[-1]}"
            )
        s_seq, t_seq = s_logits[:, :t_len], t_logits[:, :t_len]
        target = labels[:, 1:]
        resp = target != IGNORE_INDEX
        zero = s_logits.new_zeros(())
        sft = (
            F.cross_entropy(
                s_seq[:, :-1].reshape(-1, s_seq.shape[-1]).float(),
                target.reshape(-1),
                ignore_index=IGNORE_INDEX,
            )
            if self.sft_weight > 0
            else zero
        )
        kd = (
            kd_divergence(
                s_seq[:, :-1], t_seq[:, :-1], resp, temperature=self.temperature, direction=self.kd_direction
            )
            if self.kd_weight > 0
            else zero
        )
        iva = zero
        if use_iva:
            vis, inst = segments(batch, self.image_token_id)
            w = instruction_vision_attention(attn[..., :t_len, :t_len].float(), vis, inst)
            if hidden_iva:
                proj = self.iva_projection.weight
                if s_hidden[0].shape[-1] != proj.shape[1] or t_hidden[0].shape[-1] != proj.shape[0]:
                    raise ValueError(
                        f"student_width={proj.shape[1]} and teacher_width={proj.shape[0]} must be the models' "
                        f"hidden sizes, got {s_hidden[0].shape[-1]} and {t_hidden[0].shape[-1]}"
                    )
                iva = iva_hidden_divergence(
                    s_hidden[0][:, :t_len], t_hidden[0][:, :t_len], w, proj, topk=self.iva_topk
                )
            else:
                iva = iva_divergence(
                    s_seq, t_seq, w, temperature=self.temperature, direction=self.kd_direction, topk=self.iva_topk
                )
        tpa = zero
        if branches is not None:
            tpa = tpa_divergence(
                branch_logits(s_logits, t_len, branches),
                branch_logits(t_logits, t_len, branches),
                branches,
                temperature=self.temperature,
                direction=self.kd_direction,
            )
        # $$L = w_{sft} L_{sft} + w_{kd} L_{kd} + w_{iva} L_{iva} + w_{tpa} L_{tpa}$$
        loss = self.sft_weight * sft + self.kd_weight * kd + self.iva_weight * iva + self.tpa_weight * tpa
        out = {"loss": loss, "sft": sft.detach(), "kd": kd.detach(), "iva": iva.detach(), "tpa": tpa.detach()}
        if return_logits:
            out["logits"] = s_seq.detach()
        return out


def _special_ids(model: Any, image_token_id: int | None) -> tuple[int, ...]:
    """Ids a branch must not hold: the image placeholder (config or argument) and padding."""
    cfg = getattr(model, "config", None)
    ids = {
        image_token_id,
        getattr(cfg, "image_token_id", None),
        getattr(cfg, "image_token_index", None),
        getattr(cfg, "pad_token_id", None),
    }
    return tuple(sorted(int(i) for i in ids if i is not None))


@contextlib.contextmanager
def _layer_input(model: Any, layer: int | None) -> Iterator[list[torch.Tensor]]:
    """A list that receives the hidden states entering decoder layer ``layer`` during the forwards run inside the
    block (a forward pre-hook; the tensor itself, so the student's keeps its gradient); nothing when ``layer`` is
    None. Layer ``l``'s input is ``output_hidden_states[l]`` (the embeddings for ``l = 0``)."""
    seen: list[torch.Tensor] = []
    if layer is None:
        yield seen
        return

    def hook(_module: Any, args: Any, kwargs: Any) -> None:
        seen.append(args[0] if args else kwargs["hidden_states"])

    handle = _decoder_layers(model)[layer].register_forward_pre_hook(hook, with_kwargs=True)
    try:
        yield seen
    finally:
        handle.remove()


def _forward_with_attention(model: Any, inputs: dict[str, torch.Tensor], layer: int) -> tuple[Any, torch.Tensor]:
    """``(outputs, attention of decoder layer `layer`)`` from one forward, keeping only that layer's map.

    A forward hook on ``layers[layer].self_attn`` (transformers' attention modules return
    ``(output, weights)``; eager attention computes the weights whether or not ``output_attentions`` is set) takes
    the ``(B, H, T, T)`` probabilities, so the other layers' maps are never materialised. Models without a
    ``self_attn`` module fall back to ``output_attentions=True``.

    Raises:
        ValueError: the model returned no attention map (not eager attention).
    """
    block = _decoder_layers(model)[layer]
    module = getattr(block, "self_attn", None)
    if module is None:
        out = model(**inputs, output_attentions=True)
        attn = out.attentions[layer] if out.attentions else None
    else:
        seen: list[Any] = []

        def hook(_module: Any, _args: Any, output: Any) -> None:
            seen.append(output[1] if isinstance(output, tuple) and len(output) > 1 else None)

        handle = module.register_forward_hook(hook)
        try:
            out = model(**inputs)
        finally:
            handle.remove()
        attn = seen[-1] if seen else None
    if attn is None:
        raise ValueError("the teacher returned no attention maps: load it with attn_implementation='eager'")
    return out, attn


def _decoder_layers(model: Any) -> Any:
    """The decoder layers of a LLaVA-style (or plain causal) HF model."""
    inner = getattr(model, "model", model)
    lm = getattr(inner, "language_model", inner)
    layers = getattr(lm, "layers", None)
    if layers is None:
        raise TypeError(f"cannot find the decoder layers of {type(model).__name__}")
    return layers


def generalized_jsd(
    student_logits: torch.Tensor,
    teacher_logits: torch.Tensor,
    mask: torch.Tensor,
    *,
    beta: float = 0.5,
    temperature: float = 1.0,
) -> torch.Tensor:
    """GKD's generalised JSD with TRL's semantics (``beta`` 0: forward KL, 1: reverse KL), mean over ``mask``.

    ``JSD_beta = beta KL(p_T || M) + (1 - beta) KL(p_S || M)``, ``M = beta p_T + (1 - beta) p_S``
    (TRL ``GKDTrainer.generalized_jsd_loss``, Agarwal et al. 2024, Eq. 1).
    """
    if not 0 <= beta <= 1:
        raise ValueError(f"beta must be in [0, 1], got {beta}")
    _check_vocab(student_logits, teacher_logits)
    log_s = F.log_softmax(_up(student_logits) / temperature, -1)
    log_t = F.log_softmax(_up(teacher_logits) / temperature, -1)
    if beta == 0:
        div = (log_t.exp() * (log_t - log_s)).sum(-1)
    elif beta == 1:
        div = (log_s.exp() * (log_s - log_t)).sum(-1)
    else:
        b = torch.tensor(beta, dtype=log_s.dtype)
        log_m = torch.logsumexp(torch.stack([log_s + torch.log1p(-b), log_t + torch.log(b)]), 0)
        div = beta * (log_t.exp() * (log_t - log_m)).sum(-1) + (1 - beta) * (
            log_s.exp() * (log_s - log_m)
        ).sum(-1)
    mask = mask.bool()
    return (div * mask).sum() / mask.sum().clamp(min=1)
