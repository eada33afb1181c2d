"""Reproduction: cluster-level KGW (HPT-WM) against token-level KGW on a codec trained here, under audio edits.

Pipeline (models cached in ``$ICML26_CACHE``): espeak-ng speech (even utterances train, odd ones are held out);
the frame codec; a second codec (another seed) as the "neural codec" re-encoding attack; a token LM over the
codec's tokens. The round-trip confusion matrix of the training utterances gives the clusters. Per seed, for each
arm, ``n_generations`` watermarked sequences (delta, gamma, context width h) and as many unwatermarked ones are
sampled, decoded to audio, attacked, re-encoded and tested from audio only.

**Arms** (same codec, LM, key and seeds): ``base`` (token-level KGW, the identity map); ``hpt`` (Leiden on the
confusion graph); ``louvain``; ``kmeans`` (k-means on the codebook vectors, same cluster count); ``random`` (a random
partition with the same cluster sizes). **Metrics**: ``match_rate`` (held-out round trips: token match for
``base``, cluster match otherwise), median ``neglog10_p`` per attack (suffix ``_<attack>``; none for identity),
``tpr_at_001`` (watermarked, identity, p < 0.01), ``fpr_at_001`` (unwatermarked, p < 0.01), ``nll`` of the
watermarked samples under the clean LM (quality proxy; unwatermarked in ``none``), ``n_clusters``.

Example:
    >>> import dataclasses
    >>> from icml26.audio_watermark.experiment import PRESETS, run
    >>> cfg = dataclasses.replace(PRESETS["smoke"], n_utterances=6, codec_steps=2, lm_steps=2, n_generations=2,
    ...                           attacks=("identity",), cache=False)
    >>> sorted(run(cfg).metrics)[:3]
    ['base', 'hpt', 'kmeans']
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..common.plotting import new_figure, save_figure
from ..common.progress import progress
from ..common.results import SeedRun
from ..common.tiny_lm import cache_dir
from .audio import apply_attack, speech_corpus
from .clustering import ConfusionGraphClusterer, RoundTripConfusion, kmeans_clusters, random_partition
from .codec import FrameCodec, train_codec
from .lm import OFFSET, mean_nll, sample, train_token_lm
from .watermark import ClusteredKGW

ARMS = ("base", "hpt", "louvain", "kmeans", "random")


@dataclass
class Config:
    """Settings of one seed's run (``PRESETS`` holds smoke / quick / full)."""

    seed: int = 0
    """seed of the generations and the attacks"""
    n_utterances: int = 60
    """espeak-ng utterances (half train the codec, LM and clusters; half are held out)"""
    codebook_size: int = 128
    """codec vocabulary V"""
    dim: int = 16
    """codec latent dimension"""
    codec_steps: int = 600
    """codec training steps"""
    lm_steps: int = 400
    """token LM training steps"""
    n_generations: int = 20
    """watermarked (and as many unwatermarked) sequences per arm"""
    length: int = 200
    """tokens per sequence (4 s of audio)"""
    gamma: float = 0.25
    """green share"""
    delta: float = 2.0
    """green logit bias"""
    context_width: int = 1
    """h: previous tokens seeding the green list"""
    attacks: tuple[str, ...] = ("identity", "noise", "lowpass", "mp3", "crop", "codec")
    """audio edits before detection ("codec": decode -> encode with a second codec trained with another seed)"""
    min_clusters_ratio: float = 0.125
    """at least V x this many clusters (the key space must not collapse)"""
    cache: bool = True
    """cache the corpus and the trained models"""


PRESETS: dict[str, Config] = {
    "smoke": Config(n_utterances=10, codec_steps=20, lm_steps=20, n_generations=4, length=80,
                    attacks=("identity", "mp3", "codec"), cache=False),
    "quick": Config(),
    "full": Config(n_utterances=200, codec_steps=1500, lm_steps=1000, n_generations=100,
                   attacks=("identity", "noise", "lowpass", "smooth", "resample", "speed", "crop", "amplitude",
                            "requantise", "mp3", "codec")),
}


def _cached_model(cfg: Config, key: dict[str, Any], build: Any, kind: str) -> Any:
    if not cfg.cache:
        return build()
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    path = cache_dir() / "audio_watermark" / f"{kind}_{digest}.pt"
    if path.is_file():
        return torch.load(path, weights_only=False)
    obj = build()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    torch.save(obj, tmp)
    tmp.replace(path)
    return obj


def models(cfg: Config) -> tuple[list[np.ndarray], FrameCodec, FrameCodec, Any]:
    """(utterances, codec, second codec, token LM), trained once and cached."""
    cache = cache_dir() / "audio_watermark" if cfg.cache else None
    utt = speech_corpus(cfg.n_utterances, cache=cache)
    train = utt[::2]
    base = {"n": cfg.n_utterances, "K": cfg.codebook_size, "d": cfg.dim, "steps": cfg.codec_steps}

    def codec_for(seed: int) -> FrameCodec:
        return _cached_model(cfg, {**base, "seed": seed}, lambda: train_codec(
            train, codebook_size=cfg.codebook_size, dim=cfg.dim, steps=cfg.codec_steps, seed=seed,
            desc=f"codec {seed}"), "codec")

    codec, other = codec_for(0), codec_for(1)
    lm = _cached_model(cfg, {**base, "lm_steps": cfg.lm_steps}, lambda: train_token_lm(
        [codec.encode(u) for u in train], vocab=cfg.codebook_size, steps=cfg.lm_steps, seed=0), "lm")
    return utt, codec, other, lm


def cluster_maps(cfg: Config, utt: list[np.ndarray], codec: FrameCodec) -> tuple[dict[str, np.ndarray],
                                                                                   RoundTripConfusion]:
    """Every arm's token -> cluster map, fitted on the training utterances' round trips."""
    V = cfg.codebook_size
    conf = RoundTripConfusion(V)
    for u in utt[::2]:
        q = codec.encode(u)
        conf.update(q, codec.encode(codec.decode(q)))
    min_c = max(2, int(np.ceil(cfg.min_clusters_ratio * V)))
    hpt = ConfusionGraphClusterer(method="leiden", min_count=1, resolution=1.0, min_clusters=min_c).fit(conf.M)
    louv = ConfusionGraphClusterer(method="louvain", min_count=1, resolution=1.0, min_clusters=min_c).fit(conf.M)
    return {"base": np.arange(V), "hpt": hpt.labels_, "louvain": louv.labels_,
            "kmeans": kmeans_clusters(codec.codebook(), hpt.n_clusters_),
            "random": random_partition(hpt.labels_, seed=5)}, conf


def _reencode(codec: FrameCodec, other: FrameCodec, tokens: np.ndarray, attack: str,
              rng: np.random.Generator) -> np.ndarray:
    wave = codec.decode(tokens)
    if attack == "codec":
        wave = other.decode(other.encode(wave))
    else:
        wave = apply_attack(attack, wave, rng)
    return codec.encode(wave)


def run(cfg: Config) -> SeedRun:
    """One seed: every arm, watermarked and unwatermarked, under every attack."""
    if cfg.n_generations < 1 or cfg.length < 16 or not cfg.attacks:
        raise ValueError("n_generations >= 1, length >= 16 and at least one attack are needed")
    utt, codec, other, lm = models(cfg)
    maps, conf = cluster_maps(cfg, utt, codec)
    held = []
    for u in utt[1::2]:
        q = codec.encode(u)
        held.append((q, codec.encode(codec.decode(q))))
    rng = np.random.default_rng([cfg.seed, 3])
    unmarked = sample(lm, cfg.n_generations, cfg.length, seed=10_000 + cfg.seed)
    metrics: dict[str, dict[str, float]] = {"none": {"nll": mean_nll(lm, unmarked)}}
    for arm in progress(ARMS, desc=f"audio_watermark seed {cfg.seed}"):
        cmap = maps[arm]
        wm = ClusteredKGW(cmap, gamma=cfg.gamma, delta=cfg.delta, context_width=cfg.context_width,
                          key=15485863 + cfg.seed)
        marked = sample(lm, cfg.n_generations, cfg.length, processor=wm.logits_processor(1, OFFSET),
                        seed=cfg.seed)
        m: dict[str, float] = {"n_clusters": float(wm.C), "nll": mean_nll(lm, marked),
                               "match_rate": float(np.mean([(cmap[a[:min(len(a), len(b))]] ==
                                                             cmap[b[:min(len(a), len(b))]]).mean() for a, b in held]))}
        for attack in cfg.attacks:
            scores = [wm.score(_reencode(codec, other, t, attack, rng)) for t in marked]
            logp = [s.get("neglog10_p", 0.0) for s in scores]          # too few scored tokens: no evidence
            m["neglog10_p" + ("" if attack == "identity" else f"_{attack}")] = float(np.median(logp))
            if attack == "identity":
                m["tpr_at_001"] = float(np.mean([s.get("p_value", 1.0) < 0.01 for s in scores]))
        null = [wm.score(_reencode(codec, other, t, "identity", rng)) for t in unmarked]
        m["fpr_at_001"] = float(np.mean([s.get("p_value", 1.0) < 0.01 for s in null]))
        metrics[arm] = m
    metrics["base"]["token_match_rate_train"] = conf.match_rate()
    return SeedRun(metrics, series={"config": asdict(cfg)})


def plot(runs: list[SeedRun], result: dict[str, Any], out_dir: Path) -> list[Path]:
    """Median -log10 p per attack and arm (mean over seeds)."""
    fig, ax = new_figure(figsize=(9, 3.6))
    arms = [a for a in ARMS if a in result["arms"]]
    keys = sorted(k for k in result["arms"]["hpt"] if k.startswith("neglog10_p"))
    width = 0.8 / len(arms)
    for j, arm in enumerate(arms):
        ax.bar(np.arange(len(keys)) + j * width, [result["arms"][arm][k]["mean"] for k in keys], width=width,
               label=arm)
    ax.set_xticks(np.arange(len(keys)) + 0.4, [k.replace("neglog10_p", "identity").lstrip("_") or "identity"
                                                 for k in keys], rotation=30, ha="right", fontsize=7)
    ax.set_ylabel("median -log10 p")
    ax.legend(fontsize=7)
    return [save_figure(fig, out_dir / f"{result['mode']}_detection.png")]
