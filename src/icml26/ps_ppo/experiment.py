"""Reproduction of PS-PPO: accuracy, update compute and activation memory against full-trajectory GRPO.

A tiny Llama from the lab (``icml26.common.tiny_lm``), SFT-warm-started on 4-term addition chains with noisy
scratchpads (cached), is trained by critic-free RL on the verifiable reward (exact final answer). Every arm
starts from the same SFT model and sees the same prompts each iteration:

- ``grpo``: Dr.GRPO, full trajectories (group-mean advantages, constant normaliser B * L_max);
- ``ps_ppo``: uniform cutoffs; ``ps_ppo_geometric``: 0.5 uniform + 0.5 geometric(p = 1/8);
  ``ps_ppo_adaptive``: the prompt-conditioned law learned from where a prompt's rollouts decide their outcome;
- ``ps_ppo_unweighted``: uniform cutoffs without the 1 / P(c >= t) weights (the biased ablation).

The update pass is bucketed: rows sorted by kept length and split in micro-batches, each sliced to its own
longest kept prefix (without bucketing, slicing to the batch maximum saves little). Metrics, each recorded on
its natural unit so that the claims pair arms unit by unit:

- per held-out prompt (``prompts``, the same prompts in the same order for every arm): greedy correctness (0/1),
  whose mean is ``accuracy``;
- per update (``updates``; update i of every arm sees the same prompts): ``update_tokens``, the token positions
  the update's forward and backward passes process; ``update_cpu_ms``, CPU time of the update pass;
  ``peak_activation_mb``, that update's largest total size of the tensors autograd saves for backward in one
  micro-batch (the activation memory a user provisions per step); ``frac_reward_zero_std``,
  ``kept_completion_fraction``;
- for ``ps_ppo``, per replication (``replications``: independent sequences of cutoff draws on the SFT model in
  float64, whose log-softmax ``tiny_lm`` takes in float32): the relative error of the mean truncated gradient against the full-trajectory gradient after n =
  125 ... 8,000 draws, and the log-log slope of that error in n (-1/2 for an unbiased estimator; near 0 for a
  biased one, e.g. the token-count normaliser, reported beside it).

Example:
    >>> import dataclasses
    >>> from icml26.ps_ppo.experiment import PRESETS, run
    >>> cfg = dataclasses.replace(PRESETS["smoke"], iterations=1, eval_prompts=8, unbiased_draws=(20, 40),
    ...                           unbiased_replications=2)
    >>> out = run(cfg)
    >>> sorted(out.metrics)
    ['grpo', 'ps_ppo', 'ps_ppo_adaptive', 'ps_ppo_geometric', 'ps_ppo_unweighted']
    >>> sorted(out.units), len(out.units["replications"]["ps_ppo"]["grad_error_slope"])
    (['prompts', 'replications', 'updates'], 2)
"""

from __future__ import annotations

import copy
import time
from collections.abc import Hashable
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
    accuracy,
    cached,
    char_tokenizer,
    completion_batch,
    completion_logps,
    generate,
    sft,
    tiny_causal_lm,
)
from .estimator import (
    AdaptiveCutoff,
    GeometricCutoff,
    MixtureCutoff,
    UniformCutoff,
    prefix_sampled_policy_loss,
)

ARMS = ("grpo", "ps_ppo", "ps_ppo_geometric", "ps_ppo_adaptive", "ps_ppo_unweighted")


@dataclass
class Config:
    """Settings of one seed's run (``PRESETS`` holds smoke / quick / full)."""

    seed: int = 0
    """seed of the prompts, the rollouts, the cutoffs"""
    lab_seed: int = 0
    """seed of the cached SFT start"""
    terms: int = 4
    """terms per addition chain (3 scratchpad steps, completions of about 20 tokens)"""
    hidden: int = 64
    """width of the tiny Llama (2 layers)"""
    sft_steps: int = 800
    """SFT steps of the warm start (about 50 % accuracy)"""
    sft_noise: float = 0.3
    """share of corrupted scratchpad steps in the SFT data"""
    iterations: int = 40
    """RL iterations (one update each)"""
    prompts_per_iteration: int = 8
    """prompts per iteration"""
    group: int = 4
    """rollouts per prompt"""
    lr: float = 1e-4
    """AdamW learning rate, the same for every arm (1e-3 and 3e-4 degraded even the GRPO baseline's start)"""
    micro_batch: int = 8
    """rows per micro-batch of the update pass"""
    max_new_tokens: int = 28
    """generation length, also L_max of the constant normaliser"""
    eval_prompts: int = 200
    """held-out prompts for greedy accuracy"""
    eval_every: int = 0
    """accuracy curve resolution in iterations (0: final only)"""
    unbiased_draws: tuple[int, ...] = (125, 500, 2000, 8000)
    """cutoff draws at which the unbiasedness check measures the error of the mean gradient"""
    unbiased_replications: int = 8
    """independent sequences of cutoff draws in the unbiasedness check (its units)"""


PRESETS: dict[str, Config] = {
    "smoke": Config(iterations=3, eval_prompts=40, unbiased_draws=(50, 200), unbiased_replications=3),
    "quick": Config(),
    "full": Config(iterations=120, eval_prompts=500, eval_every=20),
}


def lab_model(cfg: Config) -> tuple[Any, Any]:
    """The SFT warm start (cached)."""
    task = AdditionChain(cfg.terms, 9)
    key = {"paper": "ps_ppo", "task": [task.name, cfg.terms], "steps": cfg.sft_steps, "noise": cfg.sft_noise,
           "hidden": cfg.hidden, "seed": cfg.lab_seed}

    def build() -> tuple[Any, Any]:
        tok = char_tokenizer()
        rng = np.random.default_rng(cfg.lab_seed)
        examples = [task.sample(rng) for _ in range(3000)]
        comps = [task.noisy_completion(e, rng, cfg.sft_noise) for e in examples]
        model = tiny_causal_lm(len(tok), hidden=cfg.hidden, layers=2, intermediate=2 * cfg.hidden, seed=cfg.lab_seed)
        sft(model, tok, [e.prompt for e in examples], comps, steps=cfg.sft_steps, seed=cfg.lab_seed, desc="sft ps_ppo")
        return model, tok

    model, tok = cached(key, build)
    return model.eval(), tok


def make_law(arm: str) -> Any:
    if arm in ("ps_ppo", "ps_ppo_unweighted"):
        return UniformCutoff()
    if arm == "ps_ppo_geometric":
        return MixtureCutoff([UniformCutoff(), GeometricCutoff(1 / 8)], [0.5, 0.5])
    if arm == "ps_ppo_adaptive":
        return AdaptiveCutoff(mix=0.5)
    return None


def left_align(values: torch.Tensor, mask: torch.Tensor, width: int) -> torch.Tensor:
    """Each row's masked entries moved to the left, padded with zeros to ``width`` (completion-aligned)."""
    out = values.new_zeros((values.shape[0], width))
    for i in range(values.shape[0]):
        row = values[i][mask[i] > 0]
        out[i, : len(row)] = row
    return out


class ActivationMeter:
    """Total bytes of the tensors autograd saves for backward while the context is open (activation memory)."""

    def __init__(self) -> None:
        self.bytes = 0

    def __enter__(self) -> ActivationMeter:
        def pack(t: torch.Tensor) -> torch.Tensor:
            self.bytes += t.numel() * t.element_size()
            return t

        self._hooks = torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t)
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._hooks.__exit__(*exc)


def update_pass(policy: Any, opt: torch.optim.Optimizer, batch: dict[str, torch.Tensor], advantages: torch.Tensor,
                cutoffs: torch.Tensor, survival: torch.Tensor, *, cfg: Config, weighted: bool
                ) -> tuple[int, float, int]:
    """One optimiser step on prefix-truncated, bucketed micro-batches.

    Returns (token positions processed, CPU seconds, peak activation bytes of a micro-batch).
    """
    comp = batch["completion_mask"]
    prompt_len = (comp.cumsum(1) == 0).sum(1)  # columns before the first completion token
    keep_len = prompt_len + cutoffs  # kept columns of each row (prompt + first c completion tokens)
    order = torch.argsort(keep_len)
    B, Lc = len(cutoffs), survival.shape[1]
    t0 = time.process_time()
    opt.zero_grad(set_to_none=True)
    tokens, peak = 0, 0
    for start in range(0, B, cfg.micro_batch):
        rows = order[start:start + cfg.micro_batch]
        width = int(keep_len[rows].max())
        sub = {k: v[rows, :width] for k, v in batch.items()}
        tokens += len(rows) * width
        with ActivationMeter() as meter:
            logps, mask = completion_logps(policy, sub)
            aligned = left_align(logps, mask, Lc)
            kept_mask = left_align(mask, mask, Lc)
            loss, _ = prefix_sampled_policy_loss(aligned, aligned.detach(), advantages[rows], kept_mask, cutoffs[rows],
                                                 survival[rows], max_len=cfg.max_new_tokens,
                                                 importance_weighting=weighted)
            loss = loss * len(rows) / B  # the batch objective's constant normaliser B * L_max
        peak = max(peak, meter.bytes)
        loss.backward()
    opt.step()
    return tokens, time.process_time() - t0, peak


def gradient_unbiasedness(model: Any, tok: Any, prompts: list[str], completions: list[str], advantages: torch.Tensor,
                          law: Any, draws: list[int], seed: int, normalizer: str = "constant"
                          ) -> tuple[list[float], float]:
    """Relative errors of the mean truncated gradient after each number of cutoff draws in ``draws`` (nested: the
    first n of one sequence of draws) against the full-trajectory gradient, and the cosine at the largest n.

    Float64 (except the log-softmax, which ``tiny_lm.completion_logps`` takes in float32). The surrogate is linear
    in per-token terms, so each draw's truncated gradient is the weighted sum of per-token gradients
    A_i grad log pi(y_it) over the kept tokens; the mean over draws is computed exactly from them (a prefix-only
    forward gives the same per-token log-probs: see the tests). An unbiased estimator's error
    shrinks like n^(-1/2); a biased one's levels off.
    """
    return gradient_unbiasedness_replicated(model, tok, prompts, completions, advantages, law, draws, [seed],
                                            (normalizer,))[normalizer][0]


def gradient_unbiasedness_replicated(model: Any, tok: Any, prompts: list[str], completions: list[str],
                                     advantages: torch.Tensor, law: Any, draws: list[int], seeds: list[int],
                                     normalizers: tuple[str, ...] = ("constant",)
                                     ) -> dict[str, list[tuple[list[float], float]]]:
    """``gradient_unbiasedness`` for independent sequences of cutoff draws, one per seed in ``seeds`` (the
    replications of the Monte Carlo experiment), for each normaliser (``"constant"`` B * L_max or ``"tokens"``,
    the kept-token count); the per-token gradients and the draws are shared.

    Returns:
        ``{normalizer: [(errors at each n in draws, cosine at the largest n) per seed]}``.
    """
    if unknown := set(normalizers) - {"constant", "tokens"}:
        raise ValueError(f"normalizers must be 'constant' or 'tokens', got {sorted(unknown)}")
    model = copy.deepcopy(model).double().eval()
    batch = completion_batch(tok, prompts, completions)
    logps, mask = completion_logps(model, batch)
    lengths = mask.sum(1).long()
    Lc = int(lengths.max())
    aligned = left_align(logps, mask, Lc)
    params = [p for p in model.parameters() if p.requires_grad]
    grads = {}
    for i in range(len(prompts)):
        for t in range(int(lengths[i])):
            g = torch.autograd.grad(advantages[i].double() * aligned[i, t], params, retain_graph=True)
            grads[i, t] = torch.cat([x.reshape(-1) for x in g])
    B = len(prompts)
    total = sum(grads.values())
    survival = law.survival(lengths, Lc).double()
    positions = torch.arange(Lc)
    out: dict[str, list[tuple[list[float], float]]] = {n: [] for n in normalizers}
    for seed in seeds:
        gen = torch.Generator().manual_seed(seed)
        # the draws one after another from one generator (the same sequence a loop over draws would see)
        c = torch.stack([law.sample(lengths, gen) for _ in range(max(draws))])  # (N, B)
        kept = (positions[None, None, :] < c[:, :, None]) & (positions[None, None, :] < lengths[None, :, None])
        for normalizer in normalizers:
            full = total / (B * Lc) if normalizer == "constant" else total / float(lengths.sum())
            denominator = (torch.full((len(c),), float(B * Lc), dtype=torch.float64) if normalizer == "constant"
                           else kept.sum((1, 2)).double())
            # coefficient of each per-token gradient in the sum of the first n truncated gradients
            cumulative = (kept.double() / denominator[:, None, None]).cumsum(0) / survival.clamp(min=1e-300)
            errors, cos = [], 0.0
            for n in draws:
                coef = cumulative[n - 1]
                mean = sum(coef[i, t] / n * g for (i, t), g in grads.items())
                errors.append(float(torch.linalg.vector_norm(mean - full) / torch.linalg.vector_norm(full)))
                cos = float(torch.dot(mean, full) / (torch.linalg.vector_norm(mean) * torch.linalg.vector_norm(full)))
            out[normalizer].append((errors, cos))
    return out


def replication_seeds(cfg: Config) -> list[int]:
    """Seeds of the cutoff-draw sequences of the unbiasedness check (the first is the run's seed)."""
    return [cfg.seed + 1000 * r for r in range(cfg.unbiased_replications)]


def run(cfg: Config) -> SeedRun:
    """One seed: every arm from the same SFT start on the same prompts."""
    if cfg.unbiased_replications < 1:
        raise ValueError(f"unbiased_replications must be >= 1, got {cfg.unbiased_replications}")
    pi0, tok = lab_model(cfg)
    task = AdditionChain(cfg.terms, 9)
    eval_rng = np.random.default_rng(50_000 + cfg.seed)
    eval_prompts = [task.sample(eval_rng).prompt for _ in range(cfg.eval_prompts)]
    prompt_units: dict[str, dict[str, list[float]]] = {}
    update_units: dict[str, dict[str, list[float]]] = {}
    curves: dict[str, list[tuple[int, float]]] = {}
    for arm in progress(ARMS, desc=f"ps_ppo seed {cfg.seed}"):
        torch.manual_seed(cfg.seed)
        policy = copy.deepcopy(pi0)
        opt = torch.optim.AdamW(policy.parameters(), lr=cfg.lr, weight_decay=0.0)
        law = make_law(arm)
        cut_gen = torch.Generator().manual_seed(1000 + cfg.seed)
        prompt_rng = np.random.default_rng(60_000 + cfg.seed)
        # one entry per update (iteration), in iteration order: iteration i of every arm sees the same prompts
        per_update: dict[str, list[float]] = {"update_tokens": [], "update_cpu_ms": [], "peak_activation_mb": [],
                                              "frac_reward_zero_std": [], "kept_completion_fraction": []}
        total_tokens = 0
        curve = []
        for it in range(cfg.iterations):
            examples = [task.sample(prompt_rng) for _ in range(cfg.prompts_per_iteration)]
            prompts = [e.prompt for e in examples for _ in range(cfg.group)]
            completions = generate(policy, tok, prompts, max_new_tokens=cfg.max_new_tokens, temperature=1.0,
                                   seed=10_000 * cfg.seed + it)
            rewards = torch.tensor([task.reward(p, c) for p, c in zip(prompts, completions, strict=True)])
            groups = rewards.view(-1, cfg.group)
            # $$A_i = r_i - \bar r_{group}$$   (Dr.GRPO: no std normalisation)
            advantages = (groups - groups.mean(1, keepdim=True)).reshape(-1)
            batch = completion_batch(tok, prompts, completions)
            lengths = batch["completion_mask"].sum(1).long()
            keys: list[Hashable] = [p for p in prompts]
            if law is None:
                cutoffs, survival = lengths, torch.ones(len(lengths), int(lengths.max()))
            else:
                cutoffs = law.sample(lengths, cut_gen, keys=keys) if isinstance(law, AdaptiveCutoff) else law.sample(
                    lengths, cut_gen)
                survival = (law.survival(lengths, int(lengths.max()), keys=keys) if isinstance(law, AdaptiveCutoff)
                            else law.survival(lengths, int(lengths.max())))
            n_tok, secs, act = update_pass(policy, opt, batch, advantages, cutoffs, survival, cfg=cfg,
                                           weighted=arm != "ps_ppo_unweighted")
            per_update["update_tokens"].append(float(n_tok))
            per_update["update_cpu_ms"].append(1e3 * secs)
            per_update["peak_activation_mb"].append(act / 2**20)  # this update's peak over its micro-batches
            per_update["frac_reward_zero_std"].append(float((groups.std(1) == 0).float().mean()))
            per_update["kept_completion_fraction"].append(float(cutoffs.sum() / lengths.sum()))
            total_tokens += n_tok
            if isinstance(law, AdaptiveCutoff):
                ids = [tok(c, add_special_tokens=False)["input_ids"] for c in completions]
                for g in range(cfg.prompts_per_iteration):
                    sl = slice(g * cfg.group, (g + 1) * cfg.group)
                    law.update(prompts[g * cfg.group], ids[sl], rewards[sl].tolist())
            if cfg.eval_every and (it + 1) % cfg.eval_every == 0:
                curve.append((total_tokens, accuracy(policy, tok, task, eval_prompts[:100], max_new_tokens=cfg.max_new_tokens)))
        # per held-out prompt 0/1 correctness, the same prompts in the same order for every arm
        completions = generate(policy, tok, eval_prompts, max_new_tokens=cfg.max_new_tokens)
        prompt_units[arm] = {"accuracy": [float(task.reward(p, c)) for p, c in zip(eval_prompts, completions,
                                                                                  strict=True)]}
        update_units[arm] = per_update
        curves[arm] = [*curve, (total_tokens, float(np.mean(prompt_units[arm]["accuracy"])))]
    # the unbiasedness check, on the SFT start and a fixed batch of its own rollouts; one unit per independent
    # sequence of cutoff draws (a replication of the Monte Carlo experiment)
    rng = np.random.default_rng(70_000 + cfg.seed)
    prompts = [task.sample(rng).prompt for _ in range(6)]
    completions = generate(pi0, tok, prompts, max_new_tokens=cfg.max_new_tokens, temperature=1.0, seed=cfg.seed)
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5, 1.0, -1.0])
    draws = list(cfg.unbiased_draws)
    replications: dict[str, list[float]] = {}
    reps = gradient_unbiasedness_replicated(pi0, tok, prompts, completions, adv, UniformCutoff(), draws,
                                            replication_seeds(cfg), ("constant", "tokens"))
    for suffix, normalizer in (("", "constant"), ("_token_normaliser", "tokens")):
        replications[f"grad_rel_error{suffix}"] = [errors[-1] for errors, _ in reps[normalizer]]
        replications[f"grad_cosine{suffix}"] = [cos for _, cos in reps[normalizer]]
        # $$\log \mathrm{err}(n) \approx a - \tfrac12 \log n$$ for an unbiased estimator; ~0 slope if biased
        replications[f"grad_error_slope{suffix}"] = [float(np.polyfit(np.log(draws), np.log(errors), 1)[0])
                                                     for errors, _ in reps[normalizer]]
    units = {"prompts": prompt_units, "updates": update_units, "replications": {"ps_ppo": replications}}
    return SeedRun({}, series={"curves": curves}, units=units)


def plot(runs: list[SeedRun], result: dict[str, Any], out_dir: Path) -> list[Path]:
    """Held-out accuracy against cumulative token positions processed by the updates (first seed)."""
    fig, ax = new_figure()
    for arm, curve in runs[0].series["curves"].items():
        ax.plot([x for x, _ in curve], [y for _, y in curve], marker="o", label=arm)
    ax.set_xlabel("token positions processed by the updates (cumulative)")
    ax.set_ylabel("greedy accuracy (held-out)")
    ax.legend(fontsize=7)
    return [save_figure(fig, out_dir / f"{result['mode']}_accuracy_vs_tokens.png")]
