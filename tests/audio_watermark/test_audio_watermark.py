"""Audio watermark: clustering, the watermark and its test, the codec, the attacks, calibration, the reproduction."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch

pytest.importorskip("vector_quantize_pytorch")

from icml26.audio_watermark.audio import ATTACKS, apply_attack, music_corpus, speech_corpus
from icml26.audio_watermark.clustering import (
    ConfusionGraphClusterer,
    RoundTripConfusion,
    load_cluster_map,
    random_partition,
    save_cluster_map,
)
from icml26.audio_watermark.codec import FrameCodec, check_wave, train_codec
from icml26.audio_watermark.experiment import PRESETS, run
from icml26.audio_watermark.lm import OFFSET, mean_nll, nll_per_sequence, sample, train_token_lm
from icml26.audio_watermark.watermark import ClusteredKGW, keyed_seed

from ..helpers import assert_matches_committed, reproduce_in_subprocess


def _blocks(n_blocks=4, size=5, seed=0):
    rng = np.random.default_rng(seed)
    M = rng.integers(0, 2, (n_blocks * size, n_blocks * size))
    for b in range(n_blocks):
        M[b * size:(b + 1) * size, b * size:(b + 1) * size] += 50
    np.fill_diagonal(M, 0)
    return M


@pytest.mark.parametrize("method", ["leiden", "louvain"])
def test_community_detection_recovers_confusion_blocks(method):
    cl = ConfusionGraphClusterer(method=method, min_count=5).fit(_blocks())
    assert cl.n_clusters_ == 4
    assert all(len(set(cl.labels_[b * 5:(b + 1) * 5])) == 1 for b in range(4))
    assert cl.transform(np.array([0, 6])).tolist() == [cl.labels_[0], cl.labels_[6]]
    # tokens 0 -> 1 stay in block 0 (cluster kept), 0 -> 5 leave it: r_cl = 1/2 where the token match r = 0
    assert cl.cluster_match_rate(np.array([0, 0]), np.array([1, 5, 9])) == 0.5
    more = ConfusionGraphClusterer(method=method, min_count=0, min_clusters=8).fit(_blocks())
    assert more.n_clusters_ >= 8 and more.resolution_used_ > 1.0


def test_confusion_counts_and_persistence(tmp_path):
    c = RoundTripConfusion(4).update(np.array([0, 1, 2, 3]), np.array([0, 2, 2, 1]))
    assert c.M[1, 2] == 1 and c.M[3, 1] == 1 and c.M.sum() == 2 and c.match_rate() == 0.5
    both = c + RoundTripConfusion(4).update(np.array([1]), np.array([2]))
    assert both.M[1, 2] == 2 and both.total == 5
    path = save_cluster_map(np.array([0, 0, 1, 1]), tmp_path / "map.json", codec_fingerprint="codec-A")
    assert load_cluster_map(path, codec_fingerprint="codec-A").tolist() == [0, 0, 1, 1]
    with pytest.raises(ValueError, match="built for codec 'codec-A'"):
        load_cluster_map(path, codec_fingerprint="codec-B")
    with pytest.raises(ValueError, match="tokens must be in"):
        c.update(np.array([5]), np.array([0]))
    assert sorted(np.bincount(random_partition(np.array([0, 0, 0, 1, 2, 2])))) == [1, 2, 3]


def test_p_value_against_the_binomial_tail_by_hand():
    wm = ClusteredKGW(np.arange(40) % 8, gamma=0.25, context_width=0)
    green = set(np.nonzero(wm.green_clusters(()).numpy())[0].tolist())
    tokens = np.array([t for t in range(40)])
    s = wm.score(tokens, dedup="none")
    n, g = 40, sum((t % 8) in green for t in range(40))
    assert (s["n_scored"], s["n_green"]) == (n, g)
    tail = sum(math.comb(n, k) * 0.25 ** k * 0.75 ** (n - k) for k in range(g, n + 1))
    assert s["p_value"] == pytest.approx(tail, rel=1e-9)
    assert s["z"] == pytest.approx((g - 10) / math.sqrt(40 * 0.25 * 0.75))
    few = wm.score(np.array([1, 2, 3]))
    assert few["enough"] is False and "scored tokens" in few["reason"] and "p_value" not in few


def test_green_lists_are_keyed_and_context_dependent():
    assert keyed_seed((1, 2), 7) == keyed_seed((1, 2), 7) != keyed_seed((2, 1), 7) != keyed_seed((1, 2), 8)
    wm = ClusteredKGW(np.arange(64) // 4, gamma=0.25, context_width=1)
    greens = {tuple(wm.green_clusters((c,)).nonzero()[:, 0].tolist()) for c in range(16)}
    assert len(greens) > 1 and all(len(g) == 4 for g in greens) and wm.key_space == 16
    bias = wm.bias(torch.tensor([[5, 9]]), vocab=64 + OFFSET, offset=OFFSET)
    expect = wm.green_clusters((9 // 4,))[torch.arange(64) // 4].float() * 2.0
    torch.testing.assert_close(bias[0, OFFSET:], expect)
    assert bias[0, :OFFSET].abs().sum() == 0


def test_watermarked_generation_is_detectable_and_the_null_is_calibrated():
    rng = np.random.default_rng(0)
    streams = [rng.integers(0, 32, 400) for _ in range(4)]
    lm = train_token_lm(streams, vocab=32, steps=30, seed=0, desc=None)
    wm = ClusteredKGW(np.arange(32) // 2, gamma=0.25, delta=4.0, context_width=1, key=3)
    marked = sample(lm, 8, 150, processor=wm.logits_processor(1, OFFSET), seed=1)
    plain = sample(lm, 8, 150, seed=2)
    assert np.median([wm.score(t)["neglog10_p"] for t in marked]) > 3
    # calibration under H0: uniform random tokens, many keys
    null = [ClusteredKGW(np.arange(32) // 2, context_width=1, key=k).score(rng.integers(0, 32, 200))["p_value"]
            for k in range(300)]
    assert np.mean(np.array(null) < 0.05) <= 0.08
    assert np.median([wm.score(t)["neglog10_p"] for t in plain]) < 2


def test_unwatermarked_speech_has_no_false_positives():
    utt = speech_corpus(6)
    codec = FrameCodec(codebook_size=32, dim=8, seed=0)
    pvals = [ClusteredKGW(np.arange(32) // 2, context_width=1, key=k).score(codec.encode(u))["p_value"]
             for k in range(20) for u in utt]
    assert np.mean(np.array(pvals) < 0.01) <= 0.05


def test_codec_and_bad_audio():
    codec = FrameCodec(codebook_size=16, dim=4, seed=0)
    x = np.random.default_rng(0).normal(0, 0.1, 16000).astype(np.float32)
    q = codec.encode(x)
    assert q.shape == (49,) and codec.decode(q).shape == (16000,)
    with pytest.raises(ValueError, match="16000 Hz"):
        check_wave(x, 22050)
    with pytest.raises(ValueError, match="mono"):
        check_wave(np.zeros((2, 16000), np.float32))
    with pytest.raises(TypeError, match="float samples"):
        check_wave(np.zeros(16000, np.int16))
    with pytest.raises(ValueError, match="too short"):
        codec.encode(np.zeros(100, np.float32))
    with pytest.raises(ValueError, match="NaN"):
        codec.encode(np.full(16000, np.nan, np.float32))
    with pytest.raises(ValueError, match="silent"):
        codec.encode(np.zeros(16000, np.float32))
    with pytest.raises(TypeError, match="key must be an integer"):
        ClusteredKGW(np.arange(16), key="secret")
    with pytest.raises(ValueError, match=r"tokens must be in \[0, 16\)"):
        codec.decode(np.array([20]))


def test_music_corpus_is_reproducible_and_musical():
    a, b = music_corpus(3, seed=1), music_corpus(3, seed=1)
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True)) and a[0].shape == (80_000,)
    assert not np.array_equal(a[0], music_corpus(1, seed=2)[0])
    spectrum = np.abs(np.fft.rfft(a[0]))
    peak_hz = np.argmax(spectrum[1:]) + 1
    assert 30 < peak_hz * 16_000 / len(a[0]) < 2000          # tonal energy in the musical range, not white noise
    with pytest.raises(ValueError, match="n must be"):
        music_corpus(0)


def test_trained_codec_round_trip_does_not_collapse():
    # a waveform encoder mapped every decoded (phase-less) frame to one token: r = 0; the spectral encoder must not
    utt = speech_corpus(6)
    codec = train_codec(utt[::2], codebook_size=32, dim=8, steps=60, batch=8, seed=0, desc=None)
    rates, distinct = [], []
    for u in utt[1::2]:
        q = codec.encode(u)
        q2 = codec.encode(codec.decode(q))
        rates.append((q == q2).mean())
        distinct.append(len(np.unique(q2)))
    assert np.mean(rates) > 2 / 32 and min(distinct) >= 4
    with pytest.raises(ValueError, match="steps and batch"):
        train_codec(utt, steps=0)


@pytest.mark.parametrize("name", sorted(ATTACKS))
def test_attacks(name):
    x = (0.5 * np.sin(np.linspace(0, 2000, 16000))).astype(np.float32)
    y = apply_attack(name, x, np.random.default_rng(0))
    assert y.dtype == np.float32 and np.isfinite(y).all() and abs(len(y) - 16000) <= 4800
    if name == "identity":
        assert np.array_equal(x, y)


def test_unknown_attack():
    with pytest.raises(ValueError, match="unknown attack"):
        apply_attack("reverb", np.zeros(16000, np.float32), np.random.default_rng(0))


def test_smoke_run_through_the_cli(tmp_path):
    data = reproduce_in_subprocess("audio_watermark", tmp_path, mode="smoke")
    assert {"base", "hpt", "random", "kmeans", "louvain", "none", "base_h1", "hpt_h1", "gap"} <= set(data["arms"])
    assert (tmp_path / "audio_watermark" / "smoke_detection.png").is_file()


def test_same_seed_same_numbers():
    cfg = dataclasses.replace(PRESETS["smoke"], n_utterances=6, codec_steps=3, lm_steps=3, n_generations=2,
                              attacks=("identity",))
    assert run(cfg).metrics == run(cfg).metrics
    with pytest.raises(ValueError, match="identity"):
        run(dataclasses.replace(cfg, attacks=("noise",)))


def test_per_clip_units_pair_across_arms_and_average_to_the_metrics():
    cfg = dataclasses.replace(PRESETS["smoke"], n_utterances=6, codec_steps=3, lm_steps=3, n_generations=3,
                              n_unwatermarked=5, attacks=("identity", "noise"))
    res = run(cfg)
    clips, null = res.units["clips"], res.units["unwatermarked_clips"]
    assert set(clips) == {"base", "hpt", "louvain", "kmeans", "random", "base_h1", "hpt_h1", "gap"}
    for arm, ms in clips.items():
        for name, values in ms.items():
            assert len(values) == 3, (arm, name)
            assert res.metrics[arm][name] == pytest.approx(float(np.mean(values)), abs=1e-12)
    for arm, ms in null.items():
        assert all(len(v) == 5 for v in ms.values()), arm
    for arm in ("base", "hpt", "random"):
        assert set(clips[arm]["tpr_at_001"]) <= {0.0, 1.0} and set(null[arm]["fpr_at_001"]) <= {0.0, 1.0}
        assert res.metrics[arm]["median_neglog10_p"] == pytest.approx(float(np.median(clips[arm]["neglog10_p"])))
    # the gap arm holds the per-clip differences of the paired clips
    np.testing.assert_allclose(clips["gap"]["h"], np.subtract(clips["hpt"]["neglog10_p"], clips["base"]["neglog10_p"]))
    np.testing.assert_allclose(clips["gap"]["h_plus_1"],
                               np.subtract(clips["hpt_h1"]["neglog10_p"], clips["base_h1"]["neglog10_p"]))


def test_clips_share_their_sampling_seed_across_arms():
    # with no bias (delta = 0) the watermark leaves generation alone: clip i of every arm is the same sequence
    cfg = dataclasses.replace(PRESETS["smoke"], n_utterances=6, codec_steps=3, lm_steps=3, n_generations=3,
                              attacks=("identity",), delta=0.0)
    clips = run(cfg).units["clips"]
    for arm in ("hpt", "random", "kmeans", "hpt_h1"):
        assert clips[arm]["nll"] == clips["base"]["nll"], arm


def test_nll_per_sequence_averages_to_mean_nll():
    lm = train_token_lm([np.arange(300) % 16], vocab=16, steps=2, seed=0, desc=None)
    tokens = sample(lm, 4, 20, seed=0)
    per = nll_per_sequence(lm, tokens)
    assert per.shape == (4,) and float(per.mean()) == pytest.approx(mean_nll(lm, tokens), rel=1e-5)


@pytest.mark.slow
def test_quick_reproduces_the_committed_results(tmp_path):
    data = reproduce_in_subprocess("audio_watermark", tmp_path, mode="quick")
    # The codec and the LM train in float32 and the clips are sampled from them: another CPU's BLAS changes the
    # models in the last bits, which flips sampled tokens and moves every per-clip statistic a little. Rates and
    # NLL within 0.1 (+ 10 %); -log10 p (one green token more or less moves it by about 0.3) within 0.5 (+ 10 %).
    metrics = {f"{arm}.{m}": 0.5 for arm, ms in data["arms"].items() for m in ms if "neglog10_p" in m}
    metrics.update({"gap.h": 0.5, "gap.h_plus_1": 0.5})
    assert_matches_committed(data, atol=0.1, rtol=0.1, metrics=metrics)


def test_watermark_bad_input_names_the_argument():
    with pytest.raises(ValueError, match="cluster_map must be a non-empty"):
        ClusteredKGW(np.array([], dtype=np.int64))
    with pytest.raises(ValueError, match="cluster_map"):
        ClusteredKGW(np.array([0.0, 1.0]))
    wm = ClusteredKGW(np.arange(32) // 2, context_width=1)
    with pytest.raises(TypeError, match="tokens must be integer token ids, got dtype float64"):
        wm.score(np.array([1.7, 2.2, 3.9]))
    with pytest.raises(TypeError, match="tokens must be integer"):
        wm.score(torch.tensor([1.0, 2.0]))
    assert wm.score(torch.tensor([1, 2, 3]), min_scored=1)["n_scored"] == 2.0
    with pytest.raises(ValueError, match=r"tokens must be in \[0, 32\)"):
        wm.score(np.array([1, 40]))
