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


def train_token_lm(streams: Sequence[np.ndarray], *, vocab: int, steps: int = 500, window: int = 128, batch: int = 16,
                   lr: float = 3e-3, seed: int = 0, desc: str | None = "token LM") -> Any:
    """Teacher-forced training of a 2-layer Llama (width 128) on random windows of the token streams."""
    from ..common.tiny_lm import tiny_causal_lm

    pool = [np.asarray(s) for s in streams if len(s) > window + 1]
    if not pool:
        raise ValueError(f"no token stream is longer than the window ({window} + 1)")
    model = tiny_causal_lm(vocab + OFFSET, family="llama", hidden=128, layers=2, heads=4, kv_heads=2,
                           intermediate=256, max_positions=512, seed=seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    rng = np.random.default_rng(seed)
    model.train()
    for _ in progress(range(steps), desc=desc) if desc else range(steps):
        rows = []
        for _ in range(batch):
            s = pool[int(rng.integers(len(pool)))]
            i = int(rng.integers(0, len(s) - window))
            rows.append(np.concatenate([[1], s[i:i + window] + OFFSET]))
        ids = torch.from_numpy(np.stack(rows)).long()
        loss = model(input_ids=ids, labels=ids).loss
        if not torch.isfinite(loss):
            raise FloatingPointError("token LM loss is not finite")
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return model.eval()


@torch.no_grad()
def sample(model: Any, n: int, length: int, *, processor: Any = None, seed: int = 0, temperature: float = 1.0
           ) -> np.ndarray:
    """(n, length) codec tokens sampled from bos, with an optional logits processor."""
    from transformers import LogitsProcessorList

    procs = LogitsProcessorList([processor]) if processor is not None else LogitsProcessorList()
    if processor is None:                              # still never emit the special ids
        class _NoSpecial:
            def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
                scores[:, :OFFSET] = -float("inf")
                return scores
        procs.append(_NoSpecial())
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        ids = model.generate(input_ids=torch.ones(n, 1, dtype=torch.long), attention_mask=torch.ones(n, 1,
                             dtype=torch.long), max_new_tokens=length, min_new_tokens=length, do_sample=True,
                             temperature=temperature, top_k=0, logits_processor=procs, pad_token_id=0,
                             eos_token_id=None)
    return (ids[:, 1:] - OFFSET).numpy()


@torch.no_grad()
def mean_nll(model: Any, tokens: np.ndarray) -> float:
    """Mean per-token negative log-likelihood of codec token sequences (a quality proxy)."""
    ids = torch.cat([torch.ones(len(tokens), 1, dtype=torch.long), torch.from_numpy(np.asarray(tokens)) + OFFSET], 1)
    return float(model(input_ids=ids, labels=ids).loss)


@torch.no_grad()
def nll_per_sequence(model: Any, tokens: np.ndarray) -> np.ndarray:
    """(n,) mean per-token negative log-likelihood of each codec token sequence; for sequences of equal length their
    mean is ``mean_nll`` (up to float32 rounding)."""
    ids = torch.cat([torch.ones(len(tokens), 1, dtype=torch.long), torch.from_numpy(np.asarray(tokens)) + OFFSET], 1)
    logp = torch.log_softmax(model(input_ids=ids).logits[:, :-1].float(), dim=-1)
    nll = -logp.gather(-1, ids[:, 1:, None])[..., 0]
    return nll.double().mean(1).numpy()
