"""Issue #45 item 3: audio_watermark's codec and token LM are cached as safetensors, never unpickled, and a cache
hit gives exactly the model a miss gave."""

from __future__ import annotations

import dataclasses
import pickle

import numpy as np
import pytest
import torch

pytest.importorskip("vector_quantize_pytorch")

from icml26.audio_watermark.audio import speech_corpus
from icml26.audio_watermark.codec import train_codec
from icml26.audio_watermark.experiment import PRESETS, _cached_model
from icml26.audio_watermark.lm import sample, train_token_lm


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ICML26_CACHE", str(tmp_path))
    return tmp_path


def test_a_cached_codec_encodes_and_decodes_exactly_as_the_trained_one(cache):
    cfg = dataclasses.replace(PRESETS["smoke"], codebook_size=32, dim=8, levels=2, cache=True)
    utt = speech_corpus(4)
    calls = []

    def build():
        calls.append(1)
        return train_codec(utt[::2], codebook_size=32, dim=8, steps=20, batch=4, seed=3, desc=None, levels=2)

    trained = build()
    calls.clear()
    miss = _cached_model(cfg, {"k": "codec"}, build, "codec")
    hit = _cached_model(cfg, {"k": "codec"}, build, "codec")
    assert len(calls) == 1
    for u in utt[1::2]:
        q = trained.encode(u)
        assert np.array_equal(miss.encode(u), q) and np.array_equal(hit.encode(u), q)
        assert np.array_equal(hit.decode(q), trained.decode(q))
    assert (hit.codebook_size, hit.seed, hit.levels, hit.fingerprint) == (32, 3, 2, trained.fingerprint)
    files = [p for p in cache.rglob("*") if p.is_file()]
    assert not any(p.suffix in (".pt", ".pkl", ".bin") for p in files)  # nothing a load would unpickle
    for p in files:
        if p.suffix == ".safetensors":
            with pytest.raises(pickle.UnpicklingError):
                pickle.loads(p.read_bytes())


def test_a_cached_token_lm_keeps_its_weights_and_heldout_nll(cache):
    cfg = dataclasses.replace(PRESETS["smoke"], cache=True)
    rng = np.random.default_rng(0)
    train = [rng.integers(0, 16, 300) for _ in range(3)]
    held = [rng.integers(0, 16, 300) for _ in range(2)]

    def build():
        return train_token_lm(train, vocab=16, steps=12, seed=0, desc=None, val_streams=held, eval_every=4)

    trained = build()
    hit = _cached_model(cfg, {"k": "lm"}, build, "lm")
    hit = _cached_model(cfg, {"k": "lm"}, build, "lm")
    assert hit.heldout_nll_ == trained.heldout_nll_
    ids = torch.from_numpy(np.stack([np.concatenate([[1], h[:64] + 3]) for h in held])).long()
    with torch.no_grad():
        assert torch.equal(hit(input_ids=ids).logits, trained(input_ids=ids).logits)
    assert np.array_equal(sample(hit, 2, 20, seed=1), sample(trained, 2, 20, seed=1))
