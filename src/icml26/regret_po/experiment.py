"""Reproduction of RePO: preference pairs from behaviour policies of different skill, labelled by regret.

The tiny-LM lab (``icml26.common.tiny_lm``) trains, once per ``lab_seed`` and cached, three character-level
Llamas on 3-term addition chains with a scratchpad (``3+5+2=`` -> ``3+5=8;8+2=10``):

- the starting policy pi_0 (SFT on traces with 30 % corrupted steps), also the reference;
- a strong behaviour policy mu_s (5 % corrupted steps, longer SFT) and a weak one mu_w (60 %).

On each seed, for ``n_pairs`` fresh prompts, mu_s and mu_w each sample a response (temperature 1) whose
per-token log-probs are recorded; the pair is labelled by a Bradley-Terry draw on the **oracle regret** (the
share of wrong scratchpad steps, exact here because the optimal continuation is known), not on the realised
outcome; ties are dropped. Every arm then trains pi_0 on the same pairs, in the same order, for the same steps:
DPO, RPO (DPO + chosen NLL), IPO, SimPO, RePO (with the behaviour log-probs) and RePO_det. Metrics: greedy
accuracy on held-out prompts (the task's verifiable reward), recorded per prompt (0/1, the same prompts in the
same order for every arm of a seed, so the claims pair arms by prompt), and the pair accuracy of the implicit
reward (mean log-ratio to the reference) on held-out labelled pairs.

Example:
    >>> import dataclasses
    >>> from icml26.regret_po.experiment import PRESETS, run
    >>> cfg = dataclasses.replace(PRESETS["smoke"], n_pairs=16, steps=2, eval_prompts=8, eval_every=0)
    >>> out = run(cfg)
    >>> sorted(out.metrics)
    ['dpo', 'ipo', 'repo', 'repo_det', 'rpo', 'sft', 'simpo']
    >>> len(out.units["prompts"]["repo"]["accuracy"])
    8
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..common.plotting import new_figure, save_figure
from ..common.progress import progress
from ..common.results import SeedRun
from ..common.tiny_lm import (
    AdditionChain,
    Task,
    accuracy,
    cached,
    char_tokenizer,
    completion_batch,
    completion_logps,
    generate,
    sft,
    tiny_causal_lm,
)
from .loss import RegretPOLoss, dpo_loss, ipo_loss, simpo_loss

ARMS = ("dpo", "rpo", "ipo", "simpo", "repo", "repo_det")


@dataclass
class Config:
    """Settings of one seed's run (``PRESETS`` holds smoke / quick / full)."""

    seed: int = 0
    """seed of the prompts, the sampled responses, the labels and the batch order"""
    lab_seed: int = 0
    """seed of the SFT'd lab models (pi_0, mu_s, mu_w), trained once and cached"""
    terms: int = 3
    """terms of each addition chain"""
    max_value: int = 9
    """largest number in a chain"""
    hidden: int = 64
    """width of the tiny Llamas (2 layers)"""
    sft_steps: tuple[int, int, int] = (300, 600, 300)
    """SFT steps of pi_0, mu_s, mu_w"""
    sft_noise: tuple[float, float, float] = (0.3, 0.05, 0.6)
    """share of corrupted scratchpad steps in the SFT data of pi_0, mu_s, mu_w"""
    n_pairs: int = 400
    """training prompts (one pair each before dropping ties)"""
    label_beta: float = 5.0
    """Bradley-Terry temperature on the regret difference"""
    steps: int = 120
    """preference-optimisation steps per arm"""
    batch_size: int = 32
    """pairs per step"""
    lr: float = 5e-4
    """AdamW learning rate (the same for every arm)"""
    eval_prompts: int = 300
    """held-out prompts for greedy accuracy"""
    eval_every: int = 40
    """accuracy curve resolution (0: final only)"""


PRESETS: dict[str, Config] = {
    "smoke": Config(n_pairs=96, steps=20, eval_prompts=60, eval_every=10),
    "quick": Config(),
    "full": Config(n_pairs=1000, steps=400, eval_prompts=1000, eval_every=50),
}


def lab_models(cfg: Config) -> tuple[Any, Any, Any, Any]:
    """(tokenizer, pi_0, mu_s, mu_w): SFT'd on noisy traces; cached by everything that determines them."""
    task = AdditionChain(cfg.terms, cfg.max_value)
    models = []
    for role, steps, noise in zip(("pi0", "mu_strong", "mu_weak"), cfg.sft_steps, cfg.sft_noise, strict=True):
        key = {"paper": "regret_po", "role": role, "task": [task.name, cfg.terms, cfg.max_value], "steps": steps,
               "noise": noise, "hidden": cfg.hidden, "seed": cfg.lab_seed}

        def build(steps: int = steps, noise: float = noise, role: str = role) -> tuple[Any, Any]:
            tok = char_tokenizer()
            rng = np.random.default_rng([cfg.lab_seed, len(role)])
            examples = [task.sample(rng) for _ in range(3000)]
            comps = [task.noisy_completion(e, rng, noise) for e in examples]
            model = tiny_causal_lm(len(tok), hidden=cfg.hidden, layers=2, intermediate=2 * cfg.hidden,
                                   seed=cfg.lab_seed)
            sft(model, tok, [e.prompt for e in examples], comps, steps=steps, seed=cfg.lab_seed, desc=f"sft {role}")
            return model, tok

        model, tok = cached(key, build)
        models.append(model.eval())
    return (tok, *models)


def correctness(model: Any, tok: Any, task: Task, prompts: list[str], max_new_tokens: int = 16) -> list[float]:
    """Per-prompt greedy correctness (1.0 / 0.0, in the order of ``prompts``); its mean is ``tiny_lm.accuracy``."""
    completions = generate(model, tok, prompts, max_new_tokens=max_new_tokens)
    return [float(task.reward(p, c)) for p, c in zip(prompts, completions, strict=True)]


def _values_at(mask: torch.Tensor, values: list[list[float]]) -> torch.Tensor:
    """Place each row's per-completion-token values at its mask positions (a (B, T) tensor, zeros elsewhere)."""
    out = torch.zeros(mask.shape)
    for i, row in enumerate(values):
        idx = torch.nonzero(mask[i] > 0).ravel()
        if len(idx) != len(row):
            raise ValueError(f"row {i}: {len(row)} behaviour log-probs for {len(idx)} completion tokens")
        out[i, idx] = torch.tensor(row, dtype=out.dtype)
    return out


def _sample(model: Any, tok: Any, prompts: list[str], seed: int) -> tuple[list[str], list[list[float]]]:
    """Sampled completions (temperature 1) and their per-token log-probs under the sampling model (EOS included)."""
    completions = generate(model, tok, prompts, max_new_tokens=24, temperature=1.0, seed=seed)
    batch = completion_batch(tok, prompts, [c if c else "?" for c in completions])
    with torch.no_grad():
        logps, mask = completion_logps(model, batch)
    return completions, [row[m.bool()].tolist() for row, m in zip(logps, mask, strict=True)]


def preference_data(cfg: Config, tok: Any, mu_s: Any, mu_w: Any, n: int, seed: int) -> dict[str, list[Any]]:
    """Pairs (mu_s response, mu_w response) labelled by a Bradley-Terry draw on the oracle regret."""
    task = AdditionChain(cfg.terms, cfg.max_value)
    rng = np.random.default_rng(seed)
    prompts = [task.sample(rng).prompt for _ in range(n)]
    ys, bs = _sample(mu_s, tok, prompts, seed + 1)
    yw, bw = _sample(mu_w, tok, prompts, seed + 2)
    out: dict[str, list[Any]] = {"prompt": [], "chosen": [], "rejected": [], "b_chosen": [], "b_rejected": []}
    steps = cfg.terms - 1
    for p, a, ba, b, bb in zip(prompts, ys, bs, yw, bw, strict=True):
        if not a or not b or a == b:
            continue
        # $$\mathrm{regret}(y) = \#\text{wrong scratchpad steps} / \#\text{steps}$$ (exact: the optimum is known)
        ra, rb = task.step_errors(p, a) / steps, task.step_errors(p, b) / steps
        if ra == rb:
            continue
        # $$P(y_a \succ y_b) = \sigma(\beta\,(\mathrm{regret}(y_b) - \mathrm{regret}(y_a)))$$
        a_wins = rng.random() < 1.0 / (1.0 + np.exp(-cfg.label_beta * (rb - ra)))
        (c, bc), (r, br) = ((a, ba), (b, bb)) if a_wins else ((b, bb), (a, ba))
        out["prompt"].append(p)
        out["chosen"].append(c)
        out["rejected"].append(r)
        out["b_chosen"].append(bc)
        out["b_rejected"].append(br)
    return out


def _pair_batch(tok: Any, data: dict[str, list[Any]], idx: np.ndarray) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    prompts = [data["prompt"][i] for i in idx]
    batch = completion_batch(tok, prompts * 2, [data["chosen"][i] for i in idx] + [data["rejected"][i] for i in idx])
    mask = batch["completion_mask"][:, 1:].float()
    behavior = _values_at(mask, [data["b_chosen"][i] for i in idx] + [data["b_rejected"][i] for i in idx])
    return batch, behavior


def arm_loss(arm: str, policy: torch.Tensor, ref: torch.Tensor, mask: torch.Tensor, behavior: torch.Tensor
             ) -> torch.Tensor:
    """Each arm's loss with its standard hyper-parameters (DPO/RPO/IPO beta 0.1, SimPO beta 2, gamma 1;
    RePO's official alpha 0.1, lambda 1, c_ref 1, c_sft 1)."""
    if arm == "dpo":
        return dpo_loss(policy, ref, mask, beta=0.1)
    if arm == "rpo":
        return dpo_loss(policy, ref, mask, beta=0.1, sft_coef=1.0)
    if arm == "ipo":
        return ipo_loss(policy, ref, mask, beta=0.1)
    if arm == "simpo":
        return simpo_loss(policy, mask, beta=2.0, gamma=1.0)
    if arm == "repo":
        return RegretPOLoss()(policy, ref, mask, behavior)[0]
    if arm == "repo_det":
        return RegretPOLoss(deterministic=True)(policy, ref, mask)[0]
    raise ValueError(f"unknown arm {arm!r}")


@torch.no_grad()
def pair_accuracy(policy: Any, ref: Any, tok: Any, data: dict[str, list[Any]]) -> float:
    """Share of labelled pairs where the implicit reward (mean log-ratio to the reference) prefers the chosen."""
    idx = np.arange(len(data["prompt"]))
    batch, _ = _pair_batch(tok, data, idx)
    lp, mask = completion_logps(policy, batch)
    lr, _ = completion_logps(ref, batch)
    h = ((lp - lr) * mask).sum(-1) / mask.sum(-1)
    win, lose = h.chunk(2)
    return float((win > lose).float().mean())


def train_arm(arm: str, cfg: Config, tok: Any, pi0: Any, data: dict[str, list[Any]], eval_prompts: list[str]
              ) -> tuple[Any, list[tuple[int, float]]]:
    """Preference-optimise a copy of pi_0 with ``arm``'s loss; return it and its accuracy curve."""
    task = AdditionChain(cfg.terms, cfg.max_value)
    policy = copy.deepcopy(pi0).train()
    opt = torch.optim.AdamW(policy.parameters(), lr=cfg.lr, weight_decay=0.0)
    order = np.random.default_rng(cfg.seed + 7)
    n = len(data["prompt"])
    curve = []
    for step in range(1, cfg.steps + 1):
        idx = order.integers(0, n, size=min(cfg.batch_size, n))
        batch, behavior = _pair_batch(tok, data, idx)
        logps, mask = completion_logps(policy, batch)
        with torch.no_grad():
            ref, _ = completion_logps(pi0, batch)
        loss = arm_loss(arm, logps, ref, mask, behavior)
        if not torch.isfinite(loss):
            raise FloatingPointError(f"{arm}: loss {float(loss)} at step {step}")
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if cfg.eval_every and step % cfg.eval_every == 0:
            curve.append((step, accuracy(policy, tok, task, eval_prompts[:100], max_new_tokens=16)))
            policy.train()
    return policy.eval(), curve


def run(cfg: Config) -> SeedRun:
    """One seed: fresh pairs, every arm from the same start, held-out accuracy per prompt."""
    tok, pi0, mu_s, mu_w = lab_models(cfg)
    task = AdditionChain(cfg.terms, cfg.max_value)
    data = preference_data(cfg, tok, mu_s, mu_w, cfg.n_pairs, seed=10_000 * (cfg.seed + 1))
    held_out = preference_data(cfg, tok, mu_s, mu_w, max(cfg.n_pairs // 4, 16), seed=10_000 * (cfg.seed + 1) + 5000)
    rng = np.random.default_rng(20_000 + cfg.seed)
    eval_prompts = [task.sample(rng).prompt for _ in range(cfg.eval_prompts)]
    n_pairs = float(len(data["prompt"]))
    # per-prompt 0/1 correctness, the same eval_prompts in the same order for every arm (paired by index)
    per_prompt: dict[str, dict[str, list[float]]] = {
        "sft": {"accuracy": correctness(pi0, tok, task, eval_prompts),
                "mu_strong_accuracy": correctness(mu_s, tok, task, eval_prompts),
                "mu_weak_accuracy": correctness(mu_w, tok, task, eval_prompts)}}
    metrics: dict[str, dict[str, float]] = {
        "sft": {"pair_accuracy": pair_accuracy(pi0, pi0, tok, held_out), "pairs": n_pairs}}
    curves = {}
    for arm in progress(ARMS, desc=f"regret_po seed {cfg.seed}"):
        torch.manual_seed(cfg.seed)
        policy, curve = train_arm(arm, cfg, tok, pi0, data, eval_prompts)
        per_prompt[arm] = {"accuracy": correctness(policy, tok, task, eval_prompts)}
        metrics[arm] = {"pair_accuracy": pair_accuracy(policy, pi0, tok, held_out), "pairs": n_pairs}
        curves[arm] = curve
    sft_acc = float(np.mean(per_prompt["sft"]["accuracy"]))
    return SeedRun(metrics, series={"curves": curves, "sft": sft_acc}, units={"prompts": per_prompt})


def plot(runs: list[SeedRun], result: dict[str, Any], out_dir: Path) -> list[Path]:
    """Held-out accuracy (100 prompts) against preference-optimisation steps, mean over seeds."""
    fig, ax = new_figure()
    for arm in ARMS:
        curves = [r.series["curves"][arm] for r in runs if r.series["curves"].get(arm)]
        if not curves:
            continue
        steps = [s for s, _ in curves[0]]
        ax.plot([0, *steps], [np.mean([r.series["sft"] for r in runs]),
                              *np.mean([[a for _, a in c] for c in curves], axis=0)], marker="o", label=arm)
    ax.set_xlabel("preference-optimisation step")
    ax.set_ylabel("greedy accuracy (held-out prompts)")
    ax.legend(fontsize=7)
    return [save_figure(fig, out_dir / f"{result['mode']}_accuracy_vs_steps.png")]
