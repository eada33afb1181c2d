"""A small autoregressive model over the codec's tokens (a tiny-LM lab Llama), trained here, and sampling.

Codec token t is vocabulary id ``t + OFFSET`` (ids 0, 1, 2 are pad, bos and eos); sequences start with bos.
Generation goes through ``transformers``' ``generate`` with any ``LogitsProcessor`` (the watermark's, or none).

Example:
    >>> import numpy as np
    >>> lm = train_token_lm([np.arange(300) % 16], vocab=16, steps=2, seed=0, desc=None)
    >>> sample(lm, 2, 10, seed=0).shape
    (2, 10)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from ..common.progress import progress

OFFSET = 3


def train_token_lm(
    streams: Sequence[np.ndarray],
    *,
    vocab: int,
    steps: int = 500,
    window: int = 128,
    batch: int = 16,
    lr: float = 3e-3,
    seed: int = 0,
    desc: str | None = "token LM",
    val_streams: Sequence[np.ndarray] | None = None,
    eval_every: int = 10,
    align: int = 1,
) -> Any:
    """Teacher-forced training of a 2-layer Llama (width 128) on random windows of the token streams.

    With ``val_streams`` (held-out token streams): early stopping, the weights of the step with the lowest held-out
    NLL (checked every ``eval_every`` steps) are returned, and ``model.heldout_nll_`` holds that NLL: on a small
    corpus the LM overfits within tens of steps and its samples collapse to a few repeated tokens (low entropy),
    where the watermark has nothing to bias. ``align``: training windows start at multiples of it (the number of
    interleaved streams, so that position p always holds stream p mod align).
    """
    if isinstance(align, bool) or not isinstance(align, int) or align < 1:
        raise ValueError(f"align must be a positive integer, got {align!r}")
    from ..common.tiny_lm import tiny_causal_lm

    pool = [np.asarray(s) for s in streams if len(s) > window + 1]
    if not pool:
        raise ValueError(f"no token stream is longer than the window ({window} + 1)")
    model = tiny_causal_lm(
        vocab + OFFSET,
        family="llama",
        hidden=128,
        layers=2,
        heads=4,
        kv_heads=2,
        intermediate=256,
        max_positions=512,
        seed=seed,
    )
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    rng = np.random.default_rng(seed)
    val = None
    if val_streams is not None:
        vpool = [np.asarray(s) for s in val_streams if len(s) > window + 1]
        if not vpool:
            raise ValueError(f"no held-out token stream is longer than the window ({window} + 1)")
        val = torch.from_numpy(np.stack([np.concatenate([[1], s[:window] + OFFSET]) for s in vpool])).long()
    best, best_state = float("inf"), None

    def check() -> None:
        nonlocal best, best_state
        model.eval()
        with torch.no_grad():
            v = float(model(input_ids=val, labels=val).loss)
        model.train()
        if v < best:
            best, best_state = v, {k: t.detach().clone() for k, t in model.state_dict().items()}

    model.train()
    for step in progress(range(steps), desc=desc) if desc else range(steps):
        if val is not None and step % eval_every == 0:
            check()
        rows = []
        for _ in range(batch):
            s = pool[int(rng.integers(len(pool)))]
            i = (
                align * int(rng.integers(0, (len(s) - window) // align + 1))
                if align > 1
                else int(rng.integers(0, len(s) - window))
            )
            rows.append(np.concatenate([[1], s[i : i + window] + OFFSET]))
        ids = torch.from_numpy(np.stack(rows)).long()
        loss = model(input_ids=ids, labels=ids).loss
        if not torch.isfinite(loss):
            raise FloatingPointError("token LM loss is not finite")
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    if val is not None:
        check()
        model.load_state_dict(best_state)
        model.heldout_nll_ = best
    return model.eval()


@torch.no_grad()
def sample(
    model: Any, n: int, length: int, *, processor: Any = None, seed: int = 0, temperature: float = 1.0
) -> np.ndarray:
    """(n, length) codec tokens sampled from bos, with an optional logits processor."""
    from transformers import LogitsProcessorList

    procs = LogitsProcessorList([processor]) if processor is not None else LogitsProcessorList()
    if processor is None:  # still never emit the special ids

        class _NoSpecial:
            def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
                scores[:, :OFFSET] = -float("inf")
                return scores

        procs.append(_NoSpecial())
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        ids = model.generate(
            input_ids=torch.ones(n, 1, dtype=torch.long),
            attention_mask=torch.ones(n, 1, dtype=torch.long),
            max_new_tokens=length,
            min_new_tokens=length,
            do_sample=True,
            temperature=temperature,
            top_k=0,
            logits_processor=procs,
            pad_token_id=0,
            eos_token_id=None,
        )
    return (ids[:, 1:] - OFFSET).numpy()


@torch.no_grad()
def mean_nll(model: Any, tokens: np.ndarray) -> float:
    """Mean per-token negative log-likelihood of codec token sequences (a quality proxy)."""
    ids = torch.cat(
        [torch.ones(len(tokens), 1, dtype=torch.long), torch.from_numpy(np.asarray(tokens)) + OFFSET], 1
    )
    return float(model(input_ids=ids, labels=ids).loss)


@torch.no_grad()
def nll_per_sequence(model: Any, tokens: np.ndarray) -> np.ndarray:
    """(n,) mean per-token negative log-likelihood of each codec token sequence; for sequences of equal length their
    mean is ``mean_nll`` (up to float32 rounding)."""
    ids = torch.cat(
        [torch.ones(len(tokens), 1, dtype=torch.long), torch.from_numpy(np.asarray(tokens)) + OFFSET], 1
    )
    logp = torch.log_softmax(model(input_ids=ids).logits[:, :-1].float(), dim=-1)
    nll = -logp.gather(-1, ids[:, 1:, None])[..., 0]
    return nll.double().mean(1).numpy()


def delay_pattern(tokens: np.ndarray, pad: int) -> np.ndarray:
    """MusicGen / Moshi delay pattern: ``(L, T)`` RVQ streams -> ``(L, T + L - 1)`` with stream l shifted right by l
    steps (``pad`` before and after), so at step t an LM emits level 0 of frame t, level 1 of frame t - 1, ...

    Example:
        >>> delay_pattern(np.array([[1, 2], [3, 4]]), pad=-1).tolist()
        [[1, 2, -1], [-1, 3, 4]]
    """
    x = np.asarray(tokens)
    if x.ndim != 2 or x.shape[1] == 0:
        raise ValueError(f"tokens must have shape (levels, T) with T >= 1, got {x.shape}")
    L, T = x.shape
    out = np.full((L, T + L - 1), pad, dtype=x.dtype)
    for level in range(L):
        out[level, level : level + T] = x[level]
    return out


def undelay_pattern(delayed: np.ndarray) -> np.ndarray:
    """The inverse of :func:`delay_pattern`: ``(L, T + L - 1)`` -> ``(L, T)``."""
    x = np.asarray(delayed)
    if x.ndim != 2 or x.shape[1] < x.shape[0]:
        raise ValueError(f"delayed tokens must have shape (levels, T + levels - 1), got {x.shape}")
    L = x.shape[0]
    T = x.shape[1] - L + 1
    return np.stack([x[level, level : level + T] for level in range(L)])


def flatten_delayed(tokens: np.ndarray, vocab: int) -> np.ndarray:
    """``(L, T)`` RVQ streams -> one sequence of ``L (T + L - 1)`` ids for a single LM: the delay pattern, read step
    by step (at step t: level 0 of frame t, level 1 of frame t - 1, ...), level l's token k as id ``l vocab + k``
    and the delay padding as id ``L vocab`` (so the LM's codec vocabulary is ``L vocab + 1``).

    Example:
        >>> flatten_delayed(np.array([[1, 2], [3, 4]]), vocab=5).tolist()
        [1, 10, 2, 8, 10, 9]
    """
    x = np.asarray(tokens, dtype=np.int64)
    L = x.shape[0] if x.ndim == 2 else 0
    if x.ndim != 2 or x.size == 0 or x.min() < 0 or x.max() >= vocab:
        raise ValueError(f"tokens must have shape (levels, T) with ids in [0, {vocab}), got shape {x.shape}")
    d = delay_pattern(x + vocab * np.arange(L)[:, None], pad=L * vocab)
    return np.ascontiguousarray(d.T).reshape(-1)


def unflatten_delayed(flat: np.ndarray, levels: int, vocab: int) -> np.ndarray:
    """The inverse of :func:`flatten_delayed` for a batch: ``(B, L (T + L - 1))`` -> ``(B, L, T)``."""
    x = np.asarray(flat, dtype=np.int64)
    if x.ndim != 2 or x.shape[1] % levels or x.shape[1] // levels < levels:
        raise ValueError(f"flat must have shape (B, levels * (T + levels - 1)), got {x.shape}")
    d = x.reshape(len(x), -1, levels).transpose(0, 2, 1)  # (B, L, T + L - 1)
    out = np.stack([undelay_pattern(row) for row in d]) - vocab * np.arange(levels)[None, :, None]
    if out.min() < 0 or out.max() >= vocab:
        raise ValueError("the sequence does not follow the delay pattern (a level's id out of its range)")
    return out


def delayed_streams_processor(
    levels: int, vocab: int, frames: int, *, watermark: Any = None, keys: Any = None
) -> Any:
    """A ``transformers.LogitsProcessor`` for an LM over :func:`flatten_delayed` sequences (after one bos): at
    each step only the ids of the level due (or the delay padding) are allowed, and ``watermark``
    (a ``ClusteredKGW`` with one cluster map per level) adds its bias to that level's tokens, its context the
    level's own previous tokens, one key per batch row (``keys``)."""
    from transformers import LogitsProcessor

    if watermark is not None and watermark.n_streams != levels:
        raise ValueError(f"the watermark has {watermark.n_streams} streams, the layout {levels} levels")
    pad = OFFSET + levels * vocab

    class DelayedStreamsProcessor(LogitsProcessor):
        def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
            p = input_ids.shape[1] - 1  # tokens generated so far (after bos)
            step, level = divmod(p, levels)
            out = torch.full_like(scores, -float("inf"))
            if not 0 <= step - level < frames:  # delay padding
                out[:, pad] = 0.0
                return out
            lo = OFFSET + level * vocab
            out[:, lo : lo + vocab] = scores[:, lo : lo + vocab]
            if watermark is not None:
                prev = (
                    input_ids[:, 1 + levels * level + level : 1 + p : levels] - lo
                )  # this level's frames so far
                out[:, lo : lo + vocab] += watermark.bias(prev, vocab, 0, stream=level, keys=keys).to(
                    scores.dtype
                )
            return out

    return DelayedStreamsProcessor()


@torch.no_grad()
def sample_streams(
    model: Any,
    n: int,
    frames: int,
    *,
    levels: int,
    vocab: int,
    watermark: Any = None,
    keys: Any = None,
    seed: int = 0,
    temperature: float = 1.0,
) -> np.ndarray:
    """(n, levels, frames) RVQ tokens sampled from an LM over :func:`flatten_delayed` sequences (the MusicGen /
    Moshi delay pattern), optionally watermarked (one key per generation)."""
    proc = delayed_streams_processor(levels, vocab, frames, watermark=watermark, keys=keys)
    flat = sample(
        model, n, levels * (frames + levels - 1), processor=proc, seed=seed, temperature=temperature
    )
    return unflatten_delayed(flat, levels, vocab)


@torch.no_grad()
def nll_streams(model: Any, tokens: np.ndarray, vocab: int) -> np.ndarray:
    """(n,) mean NLL per codec token (delay padding excluded) of ``(n, levels, T)`` RVQ token sequences under an LM
    over :func:`flatten_delayed` sequences (a quality proxy)."""
    x = np.asarray(tokens)
    L = x.shape[1]
    flat = np.stack([flatten_delayed(t, vocab) for t in x])
    ids = torch.cat([torch.ones(len(flat), 1, dtype=torch.long), torch.from_numpy(flat) + OFFSET], 1)
    logp = torch.log_softmax(model(input_ids=ids).logits[:, :-1].float(), dim=-1)
    nll = -logp.gather(-1, ids[:, 1:, None])[..., 0].double()
    keep = torch.from_numpy(flat != L * vocab)
    return ((nll * keep).sum(1) / keep.sum(1)).numpy()
