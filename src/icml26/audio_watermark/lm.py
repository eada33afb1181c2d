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
) -> Any:
    """Teacher-forced training of a 2-layer Llama (width 128) on random windows of the token streams.

    With ``val_streams`` (held-out token streams): early stopping, the weights of the step with the lowest held-out
    NLL (checked every ``eval_every`` steps) are returned, and ``model.heldout_nll_`` holds that NLL: on a small
    corpus the LM overfits within tens of steps and its samples collapse to a few repeated tokens (low entropy),
    where the watermark has nothing to bias.
    """
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
            i = int(rng.integers(0, len(s) - window))
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
