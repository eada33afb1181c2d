"""Reproduction: cluster-level KGW (HPT-WM) against token-level KGW on a codec trained here, under audio edits.

Pipeline (models cached in ``$ICML26_CACHE``): espeak-ng speech (even utterances train, odd ones are held out);
the frame codec; a second codec (another seed) as the "neural codec" re-encoding attack; a token LM over the
codec's tokens. The round-trip confusion matrix of the training utterances gives the clusters. Per seed, for each
arm, ``n_generations`` watermarked sequences (delta, gamma, context width h) and as many unwatermarked ones are
sampled, decoded to audio, attacked, re-encoded and tested from audio only.

**Arms** (same codec, LM and seeds): ``base`` (token-level KGW, the identity map); ``hpt`` (Leiden on the
confusion graph, at least V/4 clusters); ``louvain``; ``kmeans`` (k-means on the codebook vectors, same cluster
count); ``random`` (a random partition with the same cluster sizes), all with context width h (0, as the official
Moshi command); ``base_h1`` and ``hpt_h1`` with h + 1 (the r^(h+1) factor says the cluster gain grows with h;
``gap`` holds hpt - base at both). **Keys**: one per generation (``generation_keys``; clip i of every arm shares its
key and sampling seed), and each unwatermarked clip is tested with its own key. **The test** is calibrated:
(context, cluster) units and the exact hypergeometric null (``ClusteredKGW.score`` defaults). The LM is early-stopped
on the held-out utterances (``none.heldout_nll``).

**Metrics**: ``match_rate`` (held-out round trips: token match for ``base``, cluster match otherwise; the same for
every seed), ``neglog10_p`` per attack (suffix ``_<attack>``; none for identity), ``median_neglog10_p`` (identity; the
paper's statistic), ``auc`` (watermarked against unwatermarked -log10 p), ``detected_at_fpr_001`` / ``_0001`` (TPR at
an empirical FPR of 1 % / 0.1 %: above the (1 - alpha) quantile of the seed's unwatermarked clips), ``tpr_at_001`` /
``_1e4`` / ``_1e6`` (p below the nominal level), ``fpr_at_001`` (unwatermarked, p < 0.01: every arm's calibration),
``nll`` of the watermarked samples under the clean LM (quality proxy; unwatermarked in ``none``), ``n_clusters``,
``n_scored``, ``green_share_tokens``, ``n_scored_tokens`` and ``neglog10_p_tokens`` (on the generated tokens before
any audio: the most the codec can preserve) and ``green_share`` (after the identity round trip). **The gate**: where
the hpt arm's mean ``neglog10_p_tokens`` is below ``Config.gate`` the ``*_gated`` copies of its detection metrics are
NaN (the headline is then inconclusive, with the reason in the notes) and ``hpt.gate_passed`` is 0.

**Units** (``SeedRun.units``): every per-generation quantity is recorded per clip, and the seed's value is the
mean over clips. ``clips``: the arm's watermarked generations, paired by index across arms (``gap`` holds the per-clip
differences hpt - base at h and h + 1). ``unwatermarked_clips``: the unwatermarked generations, the same for every
arm (``fpr_at_001`` per clip, 0/1, for Clopper-Pearson; ``nll`` of ``none``).

Example:
    >>> import dataclasses
    >>> from icml26.audio_watermark.experiment import PRESETS, run
    >>> cfg = dataclasses.replace(PRESETS["smoke"], n_utterances=6, codec_steps=2, lm_steps=2, n_generations=2,
    ...                           attacks=("identity",), cache=False)
    >>> sorted(run(cfg).metrics)
    ['base', 'base_h1', 'gap', 'hpt', 'hpt_h1', 'kmeans', 'louvain', 'none', 'random']
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..common.io import atomic_write_with
from ..common.plotting import new_figure, save_figure
from ..common.progress import progress
from ..common.results import SeedRun
from ..common.tiny_lm import cache_dir
from .audio import apply_attack, music_corpus, speech_corpus
from .clustering import (
    ConfusionGraphClusterer,
    RoundTripConfusion,
    cluster_match_rate,
    kmeans_clusters,
    random_partition,
)
from .codec import FrameCodec, train_codec
from .lm import OFFSET, nll_per_sequence, sample, train_token_lm
from .watermark import ClusteredKGW, keyed_seed

ARMS = ("base", "hpt", "louvain", "kmeans", "random")


@dataclass
class Config:
    """Settings of one seed's run (``PRESETS`` holds smoke / quick / full)."""

    seed: int = 0
    """seed of the generations and the attacks"""
    n_utterances: int = 60
    """espeak-ng utterances (half train the codec, LM and clusters; half are held out)"""
    n_music: int = 20
    """procedural music clips of 5 s (split the same way)"""
    codebook_size: int = 128
    """codec vocabulary V"""
    dim: int = 16
    """codec latent dimension"""
    codec_steps: int = 300
    """codec training steps (the attack's second codec trains for half as many)"""
    lm_steps: int = 300
    """token LM training steps at most (early stopping on the held-out utterances' NLL)"""
    n_generations: int = 16
    """watermarked sequences per arm"""
    n_unwatermarked: int | None = None
    """unwatermarked sequences (shared by the arms' false-positive tests); None: as many as ``n_generations``"""
    length: int = 200
    """tokens per sequence (4 s of audio)"""
    gamma: float = 0.25
    """green share"""
    delta: float = 2.0
    """green logit bias"""
    context_width: int = 0
    """h: previous tokens seeding the green list (0 as in the official Moshi command); the extra arms
    ``base_h{h+1}`` and ``hpt_h{h+1}`` use h + 1"""
    attacks: tuple[str, ...] = ("identity", "noise", "lowpass", "mp3", "crop", "codec", "speed")
    """audio edits before detection ("codec": decode -> encode with a second codec trained with another seed)"""
    min_clusters_ratio: float = 0.25
    """at least V x this many clusters (the key space must not collapse; about V/4, issue #28)"""
    gate: float = 4.0
    """the headline is decided only where the hpt arm's mean -log10 p on the generated tokens (before any audio, the
    most a codec can preserve) reaches this (twice the claims' minimum effect of 2); else the gated metrics are NaN"""
    cache: bool = True
    """cache the corpus and the trained models"""


PRESETS: dict[str, Config] = {
    "smoke": Config(
        n_utterances=10,
        n_music=4,
        codec_steps=20,
        lm_steps=20,
        n_generations=4,
        length=80,
        attacks=("identity", "mp3", "codec"),
        cache=False,
    ),
    "quick": Config(n_unwatermarked=200),  # 200 null clips per seed and arm (600 pooled): FPR 1 % and AUC
    "full": Config(
        n_utterances=200,
        n_music=60,
        codec_steps=1500,
        lm_steps=1000,
        n_generations=100,
        n_unwatermarked=400,
        attacks=(
            "identity",
            "noise",
            "lowpass",
            "smooth",
            "resample",
            "speed",
            "crop",
            "amplitude",
            "requantise",
            "mp3",
            "codec",
        ),
    ),
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
    atomic_write_with(path, lambda tmp: torch.save(obj, tmp))
    return obj


def models(cfg: Config) -> tuple[list[np.ndarray], FrameCodec, FrameCodec, Any]:
    """(utterances, codec, second codec, token LM), trained once and cached."""
    cache = cache_dir() / "audio_watermark" if cfg.cache else None
    utt = speech_corpus(cfg.n_utterances, cache=cache) + (music_corpus(cfg.n_music) if cfg.n_music else [])
    train = utt[::2]
    base = {
        "version": 3,
        "n": cfg.n_utterances,
        "n_music": cfg.n_music,
        "K": cfg.codebook_size,
        "d": cfg.dim,
        "steps": cfg.codec_steps,
    }

    def codec_for(seed: int, steps: int) -> FrameCodec:
        return _cached_model(
            cfg,
            {**base, "seed": seed, "codec_steps": steps},
            lambda: train_codec(
                train,
                codebook_size=cfg.codebook_size,
                dim=cfg.dim,
                steps=steps,
                seed=seed,
                desc=f"codec {seed}",
            ),
            "codec",
        )

    codec, other = codec_for(0, cfg.codec_steps), codec_for(1, max(1, cfg.codec_steps // 2))
    held = utt[1::2]
    lm = _cached_model(
        cfg,
        {**base, "lm_steps": cfg.lm_steps, "early_stopping": 1},
        lambda: train_token_lm(
            [codec.encode(u) for u in train],
            vocab=cfg.codebook_size,
            steps=cfg.lm_steps,
            seed=0,
            val_streams=[codec.encode(u) for u in held],
        ),
        "lm",
    )
    return utt, codec, other, lm


def cluster_maps(
    cfg: Config, utt: list[np.ndarray], codec: FrameCodec
) -> tuple[dict[str, np.ndarray], RoundTripConfusion]:
    """Every arm's token -> cluster map, fitted on the training utterances' round trips."""
    V = cfg.codebook_size
    conf = RoundTripConfusion(V)
    for u in utt[::2]:
        q = codec.encode(u)
        conf.update(q, codec.encode(codec.decode(q)))
    min_c = max(2, int(np.ceil(cfg.min_clusters_ratio * V)))
    hpt = ConfusionGraphClusterer(method="leiden", min_count=1, resolution=1.0, min_clusters=min_c).fit(
        conf.M
    )
    louv = ConfusionGraphClusterer(method="louvain", min_count=1, resolution=1.0, min_clusters=min_c).fit(
        conf.M
    )
    return {
        "base": np.arange(V),
        "hpt": hpt.labels_,
        "louvain": louv.labels_,
        "kmeans": kmeans_clusters(codec.codebook(), hpt.n_clusters_),
        "random": random_partition(hpt.labels_, seed=5),
    }, conf


def _reencode(
    codec: FrameCodec, other: FrameCodec, tokens: np.ndarray, attack: str, rng: np.random.Generator
) -> np.ndarray:
    wave = codec.decode(tokens)
    if attack == "codec":
        wave = other.decode(other.encode(wave))
    else:
        wave = apply_attack(attack, wave, rng)
    return codec.encode(wave)


def generation_keys(seed: int, n: int, *, null: bool = False) -> list[int]:
    """One key per generation (clip i of every arm shares it, so arms stay paired); the null clips' keys are
    drawn from another namespace."""
    return [keyed_seed((seed, i, int(null)), 15485863) for i in range(n)]


def _auc(marked: list[float], unmarked: list[float]) -> float:
    """P[a watermarked statistic > an unwatermarked one] (ties count 1/2): the ROC AUC."""
    a, b = np.asarray(marked)[:, None], np.asarray(unmarked)[None, :]
    return float((a > b).mean() + 0.5 * (a == b).mean())


def _arm_metrics(
    cfg: Config,
    lm: Any,
    codec: FrameCodec,
    other: FrameCodec,
    cmap: np.ndarray,
    h: int,
    held: list[tuple[np.ndarray, np.ndarray]],
    unmarked_reencoded: list[np.ndarray],
    rng: np.random.Generator,
) -> tuple[dict[str, float], dict[str, dict[str, list[float]]], dict[str, list[float]]]:
    """One arm: ``(seed-level metrics, {unit: {metric: per-clip values}}, p-values for the ROC plot)``.

    Units: ``clips`` (the arm's watermarked generations; generation i of every arm is sampled with the same seed
    and the same key, so they pair by index) and ``unwatermarked_clips`` (the same unwatermarked generations for
    every arm, each tested with its own key). The test: (context, cluster) de-duplication, exact null.
    """
    keys = generation_keys(cfg.seed, cfg.n_generations)
    null_keys = generation_keys(cfg.seed, len(unmarked_reencoded), null=True)
    wm = ClusteredKGW(cmap, gamma=cfg.gamma, delta=cfg.delta, context_width=h, key=keys[0])

    def test(tokens: np.ndarray, key: int) -> dict[str, Any]:
        # calibrated: (context, cluster) units, p = P[sum_j Hyp(C, n_green, k_j) >= n_g] under a random key
        return ClusteredKGW(cmap, gamma=cfg.gamma, context_width=h, key=key).score(tokens, min_scored=1)

    marked = sample(
        lm, cfg.n_generations, cfg.length, processor=wm.logits_processor(1, OFFSET, keys=keys), seed=cfg.seed
    )
    on_tokens = [test(t, k) for t, k in zip(marked, keys, strict=True)]
    m: dict[str, float] = {
        "n_clusters": float(wm.C),
        "match_rate": float(np.mean([cluster_match_rate(cmap, a, b) for a, b in held])),
    }
    clips: dict[str, list[float]] = {
        "nll": [float(v) for v in nll_per_sequence(lm, marked)],
        "green_share_tokens": [s["n_green"] / max(1.0, s["n_scored"]) for s in on_tokens],
        "n_scored_tokens": [s["n_scored"] for s in on_tokens],
        "neglog10_p_tokens": [float(s.get("neglog10_p", 0.0)) for s in on_tokens],
    }
    null_scores = [test(t, k) for t, k in zip(unmarked_reencoded, null_keys, strict=True)]
    null = [float(s.get("p_value", 1.0)) for s in null_scores]
    null_stat = np.array([float(s.get("neglog10_p", 0.0)) for s in null_scores])
    for attack in cfg.attacks:
        scores = [test(_reencode(codec, other, t, attack, rng), k) for t, k in zip(marked, keys, strict=True)]
        logp = [float(s.get("neglog10_p", 0.0)) for s in scores]  # nothing scored: no evidence
        clips["neglog10_p" + ("" if attack == "identity" else f"_{attack}")] = logp
        if attack == "identity":
            m["median_neglog10_p"] = float(np.median(logp))  # the paper's statistic
            pvals = [float(s.get("p_value", 1.0)) for s in scores]
            for alpha, name in (
                (1e-2, "001"),
                (1e-4, "1e4"),
                (1e-6, "1e6"),
            ):  # nominal levels (calibrated test)
                clips[f"tpr_at_{name}"] = [float(p < alpha) for p in pvals]
            # empirical FPR: the threshold is the (1 - alpha) quantile of this seed's unwatermarked clips
            for alpha, name in ((1e-2, "001"), (1e-3, "0001")):
                cut = float(np.quantile(null_stat, 1 - alpha, method="higher"))
                clips[f"detected_at_fpr_{name}"] = [float(v > cut) for v in logp]
            m["auc"] = _auc(logp, list(null_stat))
            clips["green_share"] = [s["n_green"] / max(1.0, s["n_scored"]) for s in scores]
            clips["n_scored"] = [s["n_scored"] for s in scores]
    units = {"clips": clips, "unwatermarked_clips": {"fpr_at_001": [float(p < 0.01) for p in null]}}
    return m, units, {"marked": pvals, "unmarked": null}


GATED = ("neglog10_p", "neglog10_p_codec", "neglog10_p_mp3")


def run(cfg: Config) -> SeedRun:
    """One seed: every arm, watermarked and unwatermarked, under every attack."""
    if cfg.n_generations < 1 or cfg.length < 16 or "identity" not in cfg.attacks:
        raise ValueError(
            f"n_generations >= 1, length >= 16 and an 'identity' attack (the detection without edits) "
            f"are needed, got {cfg.n_generations}, {cfg.length}, {cfg.attacks}"
        )
    n_null = cfg.n_generations if cfg.n_unwatermarked is None else cfg.n_unwatermarked
    if n_null < 1:
        raise ValueError(f"n_unwatermarked must be >= 1, got {n_null}")
    utt, codec, other, lm = models(cfg)
    maps, conf = cluster_maps(cfg, utt, codec)
    held = []
    for u in utt[1::2]:
        q = codec.encode(u)
        held.append((q, codec.encode(codec.decode(q))))
    rng = np.random.default_rng([cfg.seed, 3])
    unmarked = sample(lm, n_null, cfg.length, seed=10_000 + cfg.seed)
    metrics: dict[str, dict[str, float]] = {}
    units: dict[str, dict[str, dict[str, list[float]]]] = {
        "unwatermarked_clips": {"none": {"nll": [float(v) for v in nll_per_sequence(lm, unmarked)]}}
    }
    unmarked_reencoded = [_reencode(codec, other, t, "identity", rng) for t in unmarked]
    arms = [(arm, maps[arm], cfg.context_width) for arm in ARMS]
    arms += [(f"{arm}_h{cfg.context_width + 1}", maps[arm], cfg.context_width + 1) for arm in ("base", "hpt")]
    pvalues = {}
    for name, cmap, h in progress(arms, desc=f"audio_watermark seed {cfg.seed}"):
        metrics[name], arm_units, pvalues[name] = _arm_metrics(
            cfg, lm, codec, other, cmap, h, held, unmarked_reencoded, rng
        )
        for unit, ms in arm_units.items():
            units.setdefault(unit, {})[name] = ms
    metrics["base"]["token_match_rate_train"] = conf.match_rate()
    metrics["none"] = {"heldout_nll": float(getattr(lm, "heldout_nll_", float("nan")))}
    deeper = f"_h{cfg.context_width + 1}"
    clip = units["clips"]
    # The gate (stated in the card before the run): the hpt arm's mean -log10 p on its generated tokens, before any
    # audio, is the most the codec can preserve; below cfg.gate a gap of 2 after audio cannot be reached, so the
    # headline metrics are NaN (inconclusive) instead of a "fails" that is a ceiling of this setup.
    ceiling = float(np.mean(clip["hpt"]["neglog10_p_tokens"]))
    metrics["hpt"]["gate_passed"] = float(ceiling >= cfg.gate)
    for name in GATED:
        if name in clip["hpt"]:
            clip["hpt"][f"{name}_gated"] = (
                list(clip["hpt"][name]) if ceiling >= cfg.gate else [float("nan")] * len(clip["hpt"][name])
            )
    # E[z | H1] ~ sqrt(N) (g - gamma) / sqrt(gamma (1 - gamma)) * r^(h+1): the cluster gain should grow with h.
    # Per clip i (generation i of every arm shares its sampling seed and key): hpt - base at h and at h + 1.
    units["clips"]["gap"] = {
        "h": [a - b for a, b in zip(clip["hpt"]["neglog10_p"], clip["base"]["neglog10_p"], strict=True)],
        "h_plus_1": [
            a - b
            for a, b in zip(
                clip["hpt" + deeper]["neglog10_p"], clip["base" + deeper]["neglog10_p"], strict=True
            )
        ],
    }
    notes = {}
    if ceiling < cfg.gate:
        why = (
            f"not decided: the hpt arm's mean -log10 p on its generated tokens before any audio is {ceiling:.2f}, "
            f"below the gate {cfg.gate} (twice the minimum effect): at h = {cfg.context_width} the calibrated "
            f"test scores each (context, cluster) once, at most C = {int(metrics['hpt']['n_clusters'])} units per "
            f"clip, so no codec could carry a gap of 2; the ungated values are in neglog10_p"
        )
        notes = {c: why for c in ("detectability", "robust_codec", "robust_mp3", "graph_not_any_partition")}
    return SeedRun(metrics, series={"config": asdict(cfg), "pvalues": pvalues}, notes=notes, units=units)


def plot(runs: list[SeedRun], result: dict[str, Any], out_dir: Path) -> list[Path]:
    """Mean -log10 p per clip, per attack and arm (mean over seeds); ROC of the identity test (seeds pooled)."""
    fig, ax = new_figure(figsize=(9, 3.6))
    arms = [a for a in result["arms"] if a not in ("none", "gap")]
    keys = sorted(k for k in result["arms"]["hpt"] if k.startswith("neglog10_p"))
    arms = [a for a in arms if all(k in result["arms"][a] for k in keys)]
    width = 0.8 / len(arms)
    for j, arm in enumerate(arms):
        ax.bar(
            np.arange(len(keys)) + j * width,
            [result["arms"][arm][k]["mean"] for k in keys],
            width=width,
            label=arm,
        )
    ax.set_xticks(
        np.arange(len(keys)) + 0.4,
        [k.replace("neglog10_p", "identity").lstrip("_") or "identity" for k in keys],
        rotation=30,
        ha="right",
        fontsize=7,
    )
    ax.set_ylabel("mean -log10 p per clip")
    ax.legend(fontsize=7)
    paths = [save_figure(fig, out_dir / f"{result['mode']}_detection.png")]
    fig, (nominal, empirical) = new_figure(ncols=2, figsize=(9, 3.6))
    alphas = np.logspace(-10, 0, 200)
    for arm in ("base", "hpt", "base_h1", "hpt_h1", "kmeans", "random"):
        marked = np.concatenate(
            [r.series["pvalues"][arm]["marked"] for r in runs if arm in r.series["pvalues"]]
        )
        unmarked = np.concatenate(
            [r.series["pvalues"][arm]["unmarked"] for r in runs if arm in r.series["pvalues"]]
        )
        nominal.plot(alphas, [(marked < a).mean() for a in alphas], label=arm)
        cuts = np.concatenate([[0.0], np.sort(np.concatenate([marked, unmarked])), [1.0 + 1e-9]])
        auc = _auc(list(-np.log10(np.maximum(marked, 1e-300))), list(-np.log10(np.maximum(unmarked, 1e-300))))
        empirical.step(
            [(unmarked < c).mean() for c in cuts],
            [(marked < c).mean() for c in cuts],
            where="post",
            label=f"{arm} (AUC {auc:.2f})",
        )
    nominal.set(xscale="log", xlabel="nominal FPR (p-value threshold)", ylabel="TPR (identity)")
    empirical.set(xlabel="FPR on unwatermarked generations (each with its own key)", ylabel="TPR (identity)")
    empirical.legend(fontsize=7)
    nominal.legend(fontsize=7)
    paths.append(save_figure(fig, out_dir / f"{result['mode']}_roc.png"))
    return paths
