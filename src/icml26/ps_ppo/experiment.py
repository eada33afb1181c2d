"""Reproduction of PS-PPO: accuracy against update compute and activation memory, versus full-trajectory GRPO.

A tiny Llama from the lab (``icml26.common.tiny_lm``), SFT-warm-started on 7-term addition chains (six scratchpad
steps: the completion is about three quarters of each sequence, so prompts are a small share of the positions;
cached), is trained by critic-free RL on the verifiable reward (exact final answer). Every arm starts from the same
SFT model and sees the same prompts and rollout seeds each iteration; each update runs ``ppo_epochs`` optimiser
steps on its batch (so the PPO clip acts), with ``micro_batches`` token-balanced micro-batches
(``microbatch.plan_micro_batches``, the same code ``PSGRPOTrainer`` runs):

- ``sft``: the warm start itself (the trivial baseline: no RL);
- ``grpo``: Dr.GRPO, full trajectories (group-mean advantages, constant normaliser B * L_max);
- ``ps_ppo``: uniform cutoffs, stratified within each prompt's group (``StratifiedCutoff``);
- ``ps_ppo_mixed``: 0.25 full trajectory + 0.75 uniform, stratified (weights at most 4);
- ``ps_ppo_adaptive``: the prompt-conditioned law (``AdaptiveCutoff``, stratified): before each update, every
  prompt's decision point d_x is read off its own group of rollouts (where a correct and an incorrect rollout first
  differ), and its cutoffs follow 0.5 Uniform{1..L} + 0.5 Geometric(1 / d_x) (the headline arm);
- ``ps_ppo_unweighted``: stratified uniform cutoffs without the 1 / P(c >= t) weights (the biased ablation; full
  preset only).

Each RL arm is trained at every learning rate of ``lrs`` and keeps the one with the best greedy accuracy on
validation prompts (disjoint from the test prompts); where the choice is the grid's smallest or largest value, the
grid grows by one step of the 1-3-10 ladder past that edge (at most ``lr_extensions`` per side, ``choose_lr``), so
the chosen rate has a tried value on each side. With ``lr_tuning_seed`` (quick and full) this search runs once, on
that seed's own RL and validation prompts, and every evaluated seed trains each arm at the chosen rate; each arm's
chosen rate, its grid's ends and whether it still sits on an edge (``lr``, ``lr_grid_low``,
``lr_grid_high``, ``lr_at_grid_edge``) go into the result, and an edge left after the extensions is noted on the
arm's accuracy claims. Metrics, each on its natural unit so the claims pair arms unit by unit:

- per test prompt (``prompts``): greedy correctness (0/1) after the last update (``accuracy``), and for the PS-PPO
  arms, of the policy after the last update whose cumulative update tokens stay within ``budget`` of GRPO's
  (``accuracy_at_budget``);
- per update (``updates``; update i of every arm sees the same prompts): ``update_tokens`` (token positions the
  forward/backward passes process, all epochs), ``update_cpu_ms`` (CPU time of the update), ``peak_activation_mb``
  (the largest micro-batch's activation memory: bytes autograd saves, each storage once, parameters excluded),
  ``saved_activation_mb`` (summed over micro-batches and epochs), ``clip_fraction`` (last epoch),
  ``frac_reward_zero_std``, ``kept_completion_fraction``;
- for ``ps_ppo``, per replication (independent sequences of cutoff draws on the SFT model in float64): the relative
  error of the mean truncated gradient against the full-trajectory gradient after n = 125 ... 8,000 draws and the
  log-log slope of that error in n (-1/2 for an unbiased estimator), beside the token-count normaliser's.

Example:
    >>> import dataclasses
    >>> from icml26.ps_ppo.experiment import PRESETS, run
    >>> cfg = dataclasses.replace(PRESETS["smoke"], iterations=1, eval_prompts=8, val_prompts=4, lrs=(1e-4,),
    ...                           unbiased_draws=(20, 40), unbiased_replications=2)
    >>> out = run(cfg)
    >>> sorted(out.metrics)
    ['grpo', 'ps_ppo', 'ps_ppo_adaptive', 'ps_ppo_mixed', 'sft']
    >>> sorted(out.units), len(out.units["replications"]["ps_ppo"]["grad_error_slope"])
    (['prompts', 'replications', 'updates'], 2)
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import math
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
    completion_batch,
    completion_logps,
    generate,
    sft_start,
)
from .estimator import AdaptiveCutoff, MixtureCutoff, UniformCutoff, prefix_sampled_policy_loss
from .microbatch import FullCutoff, StratifiedCutoff, micro_batched_backward

RL_ARMS = ("grpo", "ps_ppo", "ps_ppo_mixed", "ps_ppo_adaptive", "ps_ppo_unweighted")
ARMS = ("sft", *RL_ARMS)
PS_ARMS = ("ps_ppo", "ps_ppo_mixed", "ps_ppo_adaptive", "ps_ppo_unweighted")
#: the claims that rest on each arm's accuracy (an arm's learning rate left on a grid edge is noted on them)
ACCURACY_CLAIMS = {
    "grpo": ("accuracy_at_half_tokens_prompt_conditioned", "accuracy_at_half_tokens", "accuracy_equivalence",
             "accuracy_equivalence_mixed", "accuracy_equivalence_prompt_conditioned", "rl_room"),
    "ps_ppo": ("accuracy_at_half_tokens", "accuracy_equivalence"),
    "ps_ppo_mixed": ("accuracy_equivalence_mixed",),
    "ps_ppo_adaptive": ("accuracy_at_half_tokens_prompt_conditioned", "accuracy_equivalence_prompt_conditioned"),
    "ps_ppo_unweighted": (),
}
#: the prompt-conditioned arm's law: weight of the uniform part, and the decision point of a prompt whose group
#: has no correct-incorrect pair (its advantages are zero, so only its cost depends on it): AdaptiveCutoff's defaults
ADAPTIVE_MIX, ADAPTIVE_DEFAULT_DECISION = 0.5, 8.0


@dataclass
class Config:
    """Settings of one seed's run (``PRESETS`` holds smoke / quick / full)."""

    seed: int = 0
    """seed of the prompts, the rollouts, the cutoffs"""
    lab_seed: int = 0
    """seed of the cached SFT start"""
    terms: int = 7
    """terms per addition chain (6 scratchpad steps, completions of about 45 tokens after a 14-token prompt)"""
    hidden: int = 64
    """width of the tiny Llama (2 layers)"""
    sft_steps: int = 800
    """SFT steps of the warm start"""
    sft_noise: float = 0.1
    """share of corrupted scratchpad steps in the SFT data (six steps: about half the SFT traces are correct)"""
    iterations: int = 30
    """RL iterations (one batch of rollouts, ``ppo_epochs`` optimiser steps each)"""
    prompts_per_iteration: int = 8
    """prompts per iteration"""
    group: int = 4
    """rollouts per prompt"""
    lrs: tuple[float, ...] = (1e-5, 3e-5, 1e-4)
    """AdamW learning rates tried first for every RL arm; each arm keeps the best on the validation prompts"""
    lr_extensions: int = 2
    """ladder steps (1-3-10) the grid may grow past an edge where an arm's choice sits, per side"""
    lr_tuning_seed: int | None = None
    """None: every seed chooses its arms' learning rates on its own validation prompts; a seed: the rates are chosen
    once, on that seed's RL and validation prompts (``tuned_on_tuning_seed``), and every evaluated seed trains at
    them (must differ from the evaluated seeds)"""
    ppo_epochs: int = 2
    """optimiser steps per batch (the same for every arm; the clip acts from the second)"""
    micro_batches: int = 4
    """token-balanced micro-batches per optimiser step"""
    max_new_tokens: int = 52
    """generation length, also L_max of the constant normaliser"""
    budget: float = 0.5
    """share of GRPO's cumulative update tokens at which ``accuracy_at_budget`` is read (chosen before the run)"""
    eval_prompts: int = 200
    """held-out test prompts (greedy accuracy)"""
    val_prompts: int = 64
    """validation prompts (learning-rate choice and accuracy curves), disjoint from the test prompts"""
    curve_points: int = 3
    """points of the accuracy-versus-compute curve (validation accuracy of the chosen learning rate)"""
    unbiased_draws: tuple[int, ...] = (125, 500, 2000, 8000)
    """cutoff draws at which the unbiasedness check measures the error of the mean gradient"""
    unbiased_replications: int = 8
    """independent sequences of cutoff draws in the unbiasedness check (its units)"""
    arms: tuple[str, ...] = RL_ARMS
    """RL arms to train (``grpo`` first: its update tokens set the others' budget); ``sft`` is always reported"""


PRESETS: dict[str, Config] = {
    "smoke": Config(
        iterations=2,
        eval_prompts=16,
        val_prompts=8,
        lrs=(1e-4,),
        lr_extensions=0,
        curve_points=1,
        unbiased_draws=(50, 200),
        unbiased_replications=3,
        arms=("grpo", "ps_ppo", "ps_ppo_mixed", "ps_ppo_adaptive"),
    ),
    # the unweighted ablation only in full, and 16 iterations (a first quick run with 24 took 156 CPU-s on a loaded
    # machine, over the 2-minute budget), to keep quick under 2 minutes with a learning-rate grid per arm. Since v3
    # (issue 53) the grids grow until every arm's choice is bracketed, which both presets afford only by searching
    # them once, on a tuning seed of their own (disjoint from the evaluated seeds), on 256 validation prompts
    "quick": Config(
        iterations=16,
        val_prompts=256,
        lrs=(1e-5, 3e-5, 1e-4),
        arms=("grpo", "ps_ppo", "ps_ppo_mixed", "ps_ppo_adaptive"),
        lr_tuning_seed=50,
    ),
    "full": Config(
        iterations=60,
        eval_prompts=400,
        val_prompts=256,
        lrs=(1e-5, 3e-5, 1e-4),
        curve_points=4,
        lr_tuning_seed=150,
    ),
}


def lab_model(cfg: Config) -> tuple[Any, Any]:
    """The SFT warm start (cached)."""
    task = AdditionChain(cfg.terms, 9)
    key = {
        "paper": "ps_ppo",
        "task": [task.name, cfg.terms],
        "steps": cfg.sft_steps,
        "noise": cfg.sft_noise,
        "hidden": cfg.hidden,
        "seed": cfg.lab_seed,
    }

    def data() -> tuple[list[str], list[str]]:
        rng = np.random.default_rng(cfg.lab_seed)
        examples = sft_examples(task, rng)
        return [e.prompt for e in examples], [task.noisy_completion(e, rng, cfg.sft_noise) for e in examples]

    return sft_start(key, data, steps=cfg.sft_steps, hidden=cfg.hidden, seed=cfg.lab_seed, desc="sft ps_ppo")


#: SFT examples of the warm start
SFT_EXAMPLES = 3000


def sft_examples(task: AdditionChain, rng: np.random.Generator) -> list[Any]:
    """The warm start's SFT examples: the first ``SFT_EXAMPLES`` draws of the lab seed's generator."""
    return [task.sample(rng) for _ in range(SFT_EXAMPLES)]


def rl_prompts(cfg: Config, task: AdditionChain) -> list[list[str]]:
    """The prompts of each RL iteration (every arm and learning rate sees the same): ``prompts_per_iteration``
    draws per iteration from the seed's prompt generator."""
    rng = np.random.default_rng(60_000 + cfg.seed)
    return [[task.sample(rng).prompt for _ in range(cfg.prompts_per_iteration)] for _ in range(cfg.iterations)]


def prompt_id(prompt: str) -> str:
    """What a prompt is: a hash of its text (the same chain has the same id in every seed and split)."""
    return hashlib.sha1(prompt.encode()).hexdigest()[:12]


@dataclass
class PromptSets:
    """One seed's prompts: test and validation (held out), and what the policies trained on."""

    test: list[str]
    validation: list[str]
    rl: list[list[str]]
    """per RL iteration"""
    sft: list[str]
    """the warm start's SFT prompts (lab seed)"""
    tuning: list[str] = dataclasses.field(default_factory=list)
    """the tuning seed's validation prompts (``Config.lr_tuning_seed``; empty without one)"""


def validation_prompts(cfg: Config, task: AdditionChain, seed: int) -> list[str]:
    """``cfg.val_prompts`` draws of seed ``seed``'s validation generator."""
    rng = np.random.default_rng(80_000 + seed)
    return [task.sample(rng).prompt for _ in range(cfg.val_prompts)]


def prompt_sets(cfg: Config, task: AdditionChain) -> PromptSets:
    """The seed's prompt sets. Test prompts are drawn from the seed's test generator skipping any chain the SFT
    start or the RL updates trained on or the validation prompts pick the learning rate on, so the test set is
    disjoint from them by construction (at these sizes a skip is rare: the chains number 10^7)."""
    sft = [e.prompt for e in sft_examples(task, np.random.default_rng(cfg.lab_seed))]
    rl = rl_prompts(cfg, task)
    validation = validation_prompts(cfg, task, cfg.seed)
    # the tuning seed's validation prompts chose the learning rates: never a test prompt either
    tuning = [] if cfg.lr_tuning_seed is None else validation_prompts(cfg, task, cfg.lr_tuning_seed)
    excluded = {*sft, *(q for it in rl for q in it), *validation, *tuning}
    eval_rng = np.random.default_rng(50_000 + cfg.seed)
    test: list[str] = []
    while len(test) < cfg.eval_prompts:
        prompt = task.sample(eval_rng).prompt
        if prompt not in excluded:
            test.append(prompt)
    return PromptSets(test, validation, rl, sft, tuning)


def unbiasedness_batch(cfg: Config, task: AdditionChain) -> list[str]:
    """The six prompts of the unbiasedness check's fixed batch (the seed's own generator)."""
    rng = np.random.default_rng(70_000 + cfg.seed)
    return [task.sample(rng).prompt for _ in range(6)]


def unit_ids(cfg: Config, task: AdditionChain, sets: PromptSets
             ) -> tuple[dict[str, list[str]], dict[str, dict[str, list[str]]]]:
    """``(SeedRun.unit_ids, SeedRun.held_out)``.

    ``prompts``: ``prompt_id`` of each test prompt; trained on: the SFT prompts and every RL iteration's, validated
    on: the validation prompts. ``updates``: a hash of the iteration's prompts (update i of every arm). ``replications``:
    a hash of the unbiasedness batch and the replication's draw seed (what the Monte Carlo replication is).
    """
    batch = "|".join(unbiasedness_batch(cfg, task))
    ids = {
        "prompts": [prompt_id(q) for q in sets.test],
        "updates": [prompt_id("|".join(it)) for it in sets.rl],
        "replications": [prompt_id(f"{batch}#{seed}") for seed in replication_seeds(cfg)],
    }
    held = {"prompts": {"train": sorted({prompt_id(q) for q in [*sets.sft, *(q for it in sets.rl for q in it)]}),
                        "validation": [prompt_id(q) for q in [*sets.validation, *sets.tuning]]}}
    return ids, held


def make_law(arm: str) -> Any:
    """The cutoff law of an arm (None: full trajectories)."""
    if arm in ("ps_ppo", "ps_ppo_unweighted"):
        return StratifiedCutoff(UniformCutoff())
    if arm == "ps_ppo_mixed":
        return StratifiedCutoff(MixtureCutoff([FullCutoff(), UniformCutoff()], [0.25, 0.75]))
    if arm == "ps_ppo_adaptive":
        return StratifiedCutoff(AdaptiveCutoff(mix=ADAPTIVE_MIX, default_decision=ADAPTIVE_DEFAULT_DECISION))
    if arm == "grpo":
        return None
    raise ValueError(f"unknown arm {arm!r}")


def observe_groups(law: Any, keys: list[Hashable], batch: dict[str, torch.Tensor], rewards: torch.Tensor) -> None:
    """Feed a prompt-conditioned law (``AdaptiveCutoff``, possibly inside ``StratifiedCutoff``) each group's
    rollouts (completion token ids) and rewards before its cutoffs are drawn; other laws are left alone.

    The law then depends on the batch's rollouts but not on the parameters' update, so conditional on the batch the
    1 / S(t) weights still make the truncated gradient unbiased.
    """
    base = getattr(law, "base", law)
    if not isinstance(base, AdaptiveCutoff):
        return
    if len(keys) != len(rewards):
        raise ValueError(f"keys must hold one key per rollout ({len(rewards)}), got {len(keys)}")
    ids, comp = batch["input_ids"], batch["completion_mask"]
    rows: dict[Hashable, list[int]] = {}
    for i, k in enumerate(keys):
        rows.setdefault(k, []).append(i)
    for key, group in rows.items():
        base.update(key, [ids[i][comp[i] > 0].tolist() for i in group], [float(rewards[i]) for i in group])


def _ladder_step(lr: float, up: bool) -> float:
    """The next value of the 1-3-10 ladder above (``up``) or below ``lr``: 3e-4 -> 1e-3 or 1e-4; 5e-5 -> 1e-4 or
    3e-5."""
    k = math.floor(math.log10(lr) + 1e-9)
    ladder = [float(f"{m}e{e}") for e in (k - 1, k, k + 1) for m in (1, 3)]
    if up:
        return min(v for v in ladder if v > lr * (1 + 1e-9))
    return max(v for v in ladder if v < lr * (1 - 1e-9))


@dataclass
class LRChoice:
    """One arm's learning rate, chosen on validation prompts."""

    lr: float
    grid: list[float]
    """every rate tried, ascending (the base grid and its extensions)"""
    scores: list[float]
    """validation accuracy per rate of ``grid``"""
    extensions: int
    """rates added past an edge"""
    artifact: Any
    """what ``evaluate`` returned beside the chosen rate's score"""

    @property
    def at_edge(self) -> bool:
        """The chosen rate is the smallest or largest tried (no tried value on one side)."""
        return len(self.grid) < 2 or self.lr in (self.grid[0], self.grid[-1])

    def record(self) -> dict[str, Any]:
        """The choice as the result's series hold it."""
        return {"grid": self.grid, "scores": self.scores, "chosen": self.lr, "extensions": self.extensions,
                "at_edge": self.at_edge, "rule": "best validation accuracy; ties to the smaller rate"}


def choose_lr(grid: tuple[float, ...], evaluate: Any, max_extensions: int) -> LRChoice:
    """The rate of ``grid`` with the best ``evaluate(lr) -> (validation score, artifact)``; ties keep the smaller
    rate. While the choice is the smallest or largest rate tried, the grid grows by one 1-3-10 ladder step past
    that edge (at most ``max_extensions`` per side), so that a bracketed choice has a tried rate on each side.

    Example:
        >>> c = choose_lr((1e-4, 3e-4), lambda lr: (-abs(math.log10(lr / 2e-5)), None), 2)
        >>> c.lr, c.grid, c.at_edge
        (3e-05, [1e-05, 3e-05, 0.0001, 0.0003], False)
    """
    if not grid or any(not lr > 0 for lr in grid):
        raise ValueError(f"grid must be a non-empty tuple of positive rates, got {grid!r}")
    if max_extensions < 0:
        raise ValueError(f"max_extensions must be >= 0, got {max_extensions}")
    tried: dict[float, tuple[float, Any]] = {}
    best: float | None = None

    def better(lr: float) -> bool:
        # ties keep the smaller rate
        return best is None or tried[lr][0] > tried[best][0] or (tried[lr][0] == tried[best][0] and lr < best)

    for lr in sorted(grid):
        tried[lr] = evaluate(lr)
        if better(lr):
            best = lr
        tried = {k: (v[0], v[1] if k == best else None) for k, v in tried.items()}  # keep one artifact
    added = {"low": 0, "high": 0}
    while True:
        lrs = sorted(tried)
        if best == lrs[0] and added["low"] < max_extensions:
            side = "low"
        elif best == lrs[-1] and added["high"] < max_extensions:
            side = "high"
        else:
            break
        lr = _ladder_step(lrs[0] if side == "low" else lrs[-1], up=side == "high")
        added[side] += 1
        tried[lr] = evaluate(lr)
        if better(lr):
            best = lr
        tried = {k: (v[0], v[1] if k == best else None) for k, v in tried.items()}
    assert best is not None
    lrs = sorted(tried)
    return LRChoice(best, lrs, [tried[lr][0] for lr in lrs], sum(added.values()), tried[best][1])


def left_align(values: torch.Tensor, mask: torch.Tensor, width: int) -> torch.Tensor:
    """Each row's masked entries (one contiguous run per row) moved to the left, zero-padded to ``width``."""
    n = mask.sum(1).long()
    first = torch.where(n > 0, (mask > 0).int().argmax(1), torch.zeros_like(n))
    t = torch.arange(width, device=values.device)[None, :]
    idx = (first[:, None] + t).clamp(max=values.shape[1] - 1)
    return torch.where(t < n[:, None], values.gather(1, idx), torch.zeros((), dtype=values.dtype))


def update_pass(
    policy: Any,
    opt: torch.optim.Optimizer,
    batch: dict[str, torch.Tensor],
    advantages: torch.Tensor,
    cutoffs: torch.Tensor,
    survival: torch.Tensor,
    *,
    cfg: Config,
    weighted: bool,
) -> dict[str, float]:
    """``cfg.ppo_epochs`` optimiser steps on the prefix-truncated batch, in token-balanced micro-batches.

    The first epoch's log-probs (the rollout policy's, since nothing has moved yet) are the PPO ratio's old
    log-probs for the later epochs. Returns token positions processed, CPU seconds, the largest micro-batch's
    activation bytes, the activation bytes summed over micro-batches, and the last epoch's clip fraction.
    """
    comp = batch["completion_mask"]
    prompt_len = (comp.cumsum(1) == 0).sum(1)  # columns before the first completion token
    keep_len = prompt_len + cutoffs  # kept columns of each row (prompt + first c completion tokens)
    B, Lc = len(cutoffs), survival.shape[1]
    old = torch.zeros(B, Lc)
    out = {"tokens": 0.0, "cpu_s": 0.0, "peak_bytes": 0.0, "saved_bytes": 0.0, "clip_fraction": 0.0}
    t0 = time.process_time()
    for epoch in range(cfg.ppo_epochs):
        clipped = [0.0, 0.0]

        def loss_of(
            rows: torch.Tensor, width: int, epoch: int = epoch, clipped: list[float] = clipped
        ) -> torch.Tensor:
            sub = {k: v[rows, :width] for k, v in batch.items()}
            logps, mask = completion_logps(policy, sub)
            aligned = left_align(logps, mask, Lc)
            if epoch == 0:
                old[rows] = aligned.detach()
            loss, stats = prefix_sampled_policy_loss(
                aligned,
                old[rows],
                advantages[rows],
                left_align(mask, mask, Lc),
                cutoffs[rows],
                survival[rows],
                max_len=cfg.max_new_tokens,
                importance_weighting=weighted,
            )
            clipped[0] += stats["clip_fraction"] * stats["kept_tokens"]
            clipped[1] += stats["kept_tokens"]
            return loss * len(rows) / B  # the batch objective's constant normaliser B * L_max

        opt.zero_grad(set_to_none=True)
        stats = micro_batched_backward(keep_len, cfg.micro_batches, loss_of, model=policy)
        opt.step()
        out["tokens"] += stats.tokens
        out["peak_bytes"] = max(out["peak_bytes"], stats.peak_bytes)
        out["saved_bytes"] += stats.saved_bytes
        out["clip_fraction"] = clipped[0] / max(clipped[1], 1.0)
    out["cpu_s"] = time.process_time() - t0
    return out


def gradient_unbiasedness(
    model: Any,
    tok: Any,
    prompts: list[str],
    completions: list[str],
    advantages: torch.Tensor,
    law: Any,
    draws: list[int],
    seed: int,
    normalizer: str = "constant",
) -> tuple[list[float], float]:
    """Relative errors of the mean truncated gradient after each number of cutoff draws in ``draws`` (nested: the
    first n of one sequence of draws) against the full-trajectory gradient, and the cosine at the largest n.

    Float64 (except the log-softmax, which ``tiny_lm.completion_logps`` takes in float32). The surrogate is linear
    in per-token terms, so each draw's truncated gradient is the weighted sum of per-token gradients
    A_i grad log pi(y_it) over the kept tokens; the mean over draws is computed exactly from them (a prefix-only
    forward gives the same per-token log-probs: see the tests). An unbiased estimator's error
    shrinks like n^(-1/2); a biased one's levels off.
    """
    return gradient_unbiasedness_replicated(
        model, tok, prompts, completions, advantages, law, draws, [seed], (normalizer,)
    )[normalizer][0]


def gradient_unbiasedness_replicated(
    model: Any,
    tok: Any,
    prompts: list[str],
    completions: list[str],
    advantages: torch.Tensor,
    law: Any,
    draws: list[int],
    seeds: list[int],
    normalizers: tuple[str, ...] = ("constant",),
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
    index, rows = [], []
    for i in range(len(prompts)):
        for t in range(int(lengths[i])):
            g = torch.autograd.grad(advantages[i].double() * aligned[i, t], params, retain_graph=True)
            rows.append(torch.cat([x.reshape(-1) for x in g]))
            index.append((i, t))
    grads = torch.stack(rows)  # (tokens, parameters): the per-token gradients A_i grad log pi(y_it)
    ii, tt = torch.tensor([i for i, _ in index]), torch.tensor([t for _, t in index])
    B = len(prompts)
    total = grads.sum(0)
    survival = law.survival(lengths, Lc).double()  # the law's marginal survival (stratified draws keep it)
    positions = torch.arange(Lc)
    out: dict[str, list[tuple[list[float], float]]] = {n: [] for n in normalizers}
    for seed in seeds:
        gen = torch.Generator().manual_seed(seed)
        # the draws one after another from one generator (the same sequence a loop over draws would see)
        c = torch.stack([law.sample(lengths, gen) for _ in range(max(draws))])  # (N, B)
        kept = (positions[None, None, :] < c[:, :, None]) & (
            positions[None, None, :] < lengths[None, :, None]
        )
        for normalizer in normalizers:
            full = total / (B * Lc) if normalizer == "constant" else total / float(lengths.sum())
            denominator = (
                torch.full((len(c),), float(B * Lc), dtype=torch.float64)
                if normalizer == "constant"
                else kept.sum((1, 2)).double()
            )
            # coefficient of each per-token gradient in the sum of the first n truncated gradients
            cumulative = (kept.double() / denominator[:, None, None]).cumsum(0) / survival.clamp(min=1e-300)
            errors, cos = [], 0.0
            for n in draws:
                coef = cumulative[n - 1]
                mean = (coef[ii, tt] / n) @ grads
                errors.append(float(torch.linalg.vector_norm(mean - full) / torch.linalg.vector_norm(full)))
                cos = float(
                    torch.dot(mean, full) / (torch.linalg.vector_norm(mean) * torch.linalg.vector_norm(full))
                )
            out[normalizer].append((errors, cos))
    return out


def replication_seeds(cfg: Config) -> list[int]:
    """Seeds of the cutoff-draw sequences of the unbiasedness check (the first is the run's seed)."""
    return [cfg.seed + 1000 * r for r in range(cfg.unbiased_replications)]


def _greedy_correct(
    policy: Any, tok: Any, task: AdditionChain, prompts: list[str], cfg: Config
) -> list[float]:
    completions = generate(policy, tok, prompts, max_new_tokens=cfg.max_new_tokens)
    return [float(task.reward(p, c)) for p, c in zip(prompts, completions, strict=True)]


def _train(
    arm: str, lr: float, pi0: Any, tok: Any, task: AdditionChain, cfg: Config, budget_tokens: float | None,
    iteration_prompts: list[list[str]] | None = None,
) -> dict[str, Any]:
    """One RL arm at one learning rate: per-update records, curve snapshots and the within-budget snapshot."""
    torch.manual_seed(cfg.seed)
    policy = copy.deepcopy(pi0)
    opt = torch.optim.AdamW(policy.parameters(), lr=lr, weight_decay=0.0)
    law = make_law(arm)
    cut_gen = torch.Generator().manual_seed(1000 + cfg.seed)
    iteration_prompts = rl_prompts(cfg, task) if iteration_prompts is None else iteration_prompts
    per_update: dict[str, list[float]] = {
        k: []
        for k in (
            "update_tokens",
            "update_cpu_ms",
            "peak_activation_mb",
            "saved_activation_mb",
            "clip_fraction",
            "frac_reward_zero_std",
            "kept_completion_fraction",
        )
    }
    marks = {round(cfg.iterations * (k + 1) / cfg.curve_points) for k in range(cfg.curve_points)}
    snapshots: list[tuple[float, float, dict[str, torch.Tensor]]] = [
        (0.0, 0.0, copy.deepcopy(pi0.state_dict()))
    ]
    budget_state = None
    tokens = cpu = 0.0
    for it in range(cfg.iterations):
        prompts = [q for q in iteration_prompts[it] for _ in range(cfg.group)]
        completions = generate(
            policy,
            tok,
            prompts,
            max_new_tokens=cfg.max_new_tokens,
            temperature=1.0,
            seed=10_000 * cfg.seed + it,
        )
        rewards = torch.tensor([task.reward(p, c) for p, c in zip(prompts, completions, strict=True)])
        groups = rewards.view(-1, cfg.group)
        # $$A_i = r_i - \bar r_{group}$$   (Dr.GRPO: no std normalisation)
        advantages = (groups - groups.mean(1, keepdim=True)).reshape(-1)
        batch = completion_batch(tok, prompts, completions)
        lengths = batch["completion_mask"].sum(1).long()
        keys: list[Hashable] = [
            f"{it}:{g}" for g in range(cfg.prompts_per_iteration) for _ in range(cfg.group)
        ]
        if law is None:
            cutoffs, survival = lengths, torch.ones(len(lengths), int(lengths.max()))
        else:
            observe_groups(law, keys, batch, rewards)
            cutoffs = law.sample(lengths, cut_gen, keys=keys)
            survival = law.survival(lengths, int(lengths.max()), keys=keys)
        out = update_pass(
            policy, opt, batch, advantages, cutoffs, survival, cfg=cfg, weighted=arm != "ps_ppo_unweighted"
        )
        per_update["update_tokens"].append(out["tokens"])
        per_update["update_cpu_ms"].append(1e3 * out["cpu_s"])
        per_update["peak_activation_mb"].append(out["peak_bytes"] / 2**20)
        per_update["saved_activation_mb"].append(out["saved_bytes"] / 2**20)
        per_update["clip_fraction"].append(out["clip_fraction"])
        per_update["frac_reward_zero_std"].append(float((groups.std(1) == 0).float().mean()))
        per_update["kept_completion_fraction"].append(float(cutoffs.sum() / lengths.sum()))
        tokens += out["tokens"]
        cpu += out["cpu_s"]
        if budget_tokens is not None and tokens <= budget_tokens:
            budget_state = copy.deepcopy(policy.state_dict())
        if it + 1 in marks:
            snapshots.append((tokens, cpu, copy.deepcopy(policy.state_dict())))
    return {
        "policy": policy,
        "per_update": per_update,
        "snapshots": snapshots,
        "budget_state": budget_state,
        "tokens": tokens,
    }


def _evaluator(
    arm: str, pi0: Any, tok: Any, task: AdditionChain, cfg: Config, sets: PromptSets, budget: float | None
) -> Any:
    """``evaluate(lr) -> (validation accuracy, trained run)``: ``arm`` trained at ``lr`` on the seed's RL prompts,
    scored on its validation prompts."""

    def evaluate(lr: float) -> tuple[float, dict[str, Any]]:
        trained = _train(arm, lr, pi0, tok, task, cfg, budget, sets.rl)
        return float(np.mean(_greedy_correct(trained["policy"], tok, task, sets.validation, cfg))), trained

    return evaluate


def tune_arms(cfg: Config) -> dict[str, LRChoice]:
    """Every arm's learning rate chosen on ``cfg.seed``'s own RL and validation prompts (``choose_lr``; grpo
    first: its chosen run sets the PS arms' token budget). The artifacts are dropped."""
    pi0, tok = lab_model(cfg)
    task = AdditionChain(cfg.terms, 9)
    sets = prompt_sets(cfg, task)
    out: dict[str, LRChoice] = {}
    budget_tokens: float | None = None
    for arm in progress(cfg.arms, desc=f"ps_ppo learning rates on seed {cfg.seed}"):
        evaluate = _evaluator(arm, pi0, tok, task, cfg, sets, budget_tokens if arm in PS_ARMS else None)
        choice = choose_lr(cfg.lrs, evaluate, cfg.lr_extensions)
        if arm == "grpo":
            budget_tokens = cfg.budget * choice.artifact["tokens"]
        out[arm] = dataclasses.replace(choice, artifact=None)
    return out


_TUNED: dict[str, dict[str, LRChoice]] = {}


def tuned_on_tuning_seed(cfg: Config) -> dict[str, LRChoice]:
    """``tune_arms`` on the tuning seed ``cfg.lr_tuning_seed`` (its own RL and validation prompts, never the
    evaluated seed's), cached per configuration so that the seeds of one run share one choice."""
    tuning_cfg = dataclasses.replace(cfg, seed=cfg.lr_tuning_seed, lr_tuning_seed=None)
    key = repr(tuning_cfg)
    if key not in _TUNED:
        _TUNED[key] = tune_arms(tuning_cfg)
    return _TUNED[key]


def run(cfg: Config) -> SeedRun:
    """One seed: every arm from the same SFT start on the same prompts; each arm's learning rate on validation."""
    if cfg.unbiased_replications < 1:
        raise ValueError(f"unbiased_replications must be >= 1, got {cfg.unbiased_replications}")
    if not cfg.lrs or any(not lr > 0 for lr in cfg.lrs):
        raise ValueError(f"lrs must be a non-empty tuple of positive learning rates, got {cfg.lrs!r}")
    if not 0.0 < cfg.budget <= 1.0:
        raise ValueError(f"budget must be in (0, 1], got {cfg.budget}")
    if cfg.lr_tuning_seed is not None and cfg.lr_tuning_seed == cfg.seed:
        raise ValueError(f"lr_tuning_seed must differ from the evaluated seed, got {cfg.lr_tuning_seed}")
    if not cfg.arms or cfg.arms[0] != "grpo" or set(cfg.arms) - set(RL_ARMS):
        raise ValueError(f"arms must start with 'grpo' and be among {RL_ARMS}, got {cfg.arms!r}")
    if cfg.ppo_epochs < 1 or cfg.micro_batches < 1 or cfg.curve_points < 1:
        raise ValueError("ppo_epochs, micro_batches and curve_points must be >= 1")
    pi0, tok = lab_model(cfg)
    task = AdditionChain(cfg.terms, 9)
    sets = prompt_sets(cfg, task)
    test_prompts, val_prompts = sets.test, sets.validation
    prompt_units: dict[str, dict[str, list[float]]] = {
        "sft": {"accuracy": _greedy_correct(pi0, tok, task, test_prompts, cfg)}
    }
    update_units: dict[str, dict[str, list[float]]] = {}
    sft_val = float(np.mean(_greedy_correct(pi0, tok, task, val_prompts, cfg)))
    curves: dict[str, list[tuple[float, float, float]]] = {"sft": [(0.0, 0.0, sft_val)]}
    chosen_lr: dict[str, float] = {}
    tuning: dict[str, dict[str, Any]] = {}
    notes: dict[str, list[str]] = {}
    lr_metrics: dict[str, dict[str, float]] = {}
    fixed = tuned_on_tuning_seed(cfg) if cfg.lr_tuning_seed is not None else None
    budget_tokens: float | None = None
    for arm in progress(cfg.arms, desc=f"ps_ppo seed {cfg.seed}"):
        # one arm at a time: grpo's chosen run sets the PS arms' token budget
        evaluate = _evaluator(arm, pi0, tok, task, cfg, sets, budget_tokens if arm in PS_ARMS else None)
        if fixed is None:
            choice = choose_lr(cfg.lrs, evaluate, cfg.lr_extensions)
            best, best_val = choice.artifact, choice.scores[choice.grid.index(choice.lr)]
        else:
            choice = fixed[arm]
            best_val, best = evaluate(choice.lr)
        chosen_lr[arm], tuning[arm] = choice.lr, choice.record()
        lr_metrics[arm] = {
            "lr": choice.lr,
            "lr_grid_low": choice.grid[0],
            "lr_grid_high": choice.grid[-1],
            "lr_at_grid_edge": float(choice.at_edge),
        }
        if choice.at_edge:
            side = "smallest" if choice.lr == choice.grid[0] else "largest"
            tried = ", ".join(f"{v:g}" for v in choice.grid)
            for claim in ACCURACY_CLAIMS[arm]:
                notes.setdefault(claim, []).append(
                    f"{arm}'s learning rate {choice.lr:g} is the {side} of the rates tried on validation ({tried}) "
                    f"after {choice.extensions} grid extension(s) (at most {cfg.lr_extensions} per side): "
                    "not bracketed"
                )
        if arm == "grpo":
            budget_tokens = cfg.budget * best["tokens"]
        prompt_units[arm] = {"accuracy": _greedy_correct(best["policy"], tok, task, test_prompts, cfg)}
        if arm in PS_ARMS:
            at_budget = copy.deepcopy(pi0)
            at_budget.load_state_dict(
                best["budget_state"] if best["budget_state"] is not None else pi0.state_dict()
            )
            prompt_units[arm]["accuracy_at_budget"] = _greedy_correct(at_budget, tok, task, test_prompts, cfg)
        update_units[arm] = best["per_update"]
        curve = [(0.0, 0.0, sft_val)]
        probe = copy.deepcopy(pi0)
        for tokens, cpu, state in best["snapshots"][1:-1]:
            probe.load_state_dict(state)
            curve.append((tokens, cpu, float(np.mean(_greedy_correct(probe, tok, task, val_prompts, cfg)))))
        tokens, cpu, _ = best["snapshots"][-1]
        curves[arm] = [*curve, (tokens, cpu, best_val)]
    # the unbiasedness check, on the SFT start and a fixed batch of its own rollouts; one unit per independent
    # sequence of cutoff draws (a replication of the Monte Carlo experiment)
    prompts = unbiasedness_batch(cfg, task)
    completions = generate(
        pi0, tok, prompts, max_new_tokens=cfg.max_new_tokens, temperature=1.0, seed=cfg.seed
    )
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5, 1.0, -1.0])
    draws = list(cfg.unbiased_draws)
    replications: dict[str, list[float]] = {}
    reps = gradient_unbiasedness_replicated(
        pi0,
        tok,
        prompts,
        completions,
        adv,
        UniformCutoff(),
        draws,
        replication_seeds(cfg),
        ("constant", "tokens"),
    )
    for suffix, normalizer in (("", "constant"), ("_token_normaliser", "tokens")):
        replications[f"grad_rel_error{suffix}"] = [errors[-1] for errors, _ in reps[normalizer]]
        replications[f"grad_cosine{suffix}"] = [cos for _, cos in reps[normalizer]]
        # $$\log \mathrm{err}(n) \approx a - \tfrac12 \log n$$ for an unbiased estimator; ~0 slope if biased
        replications[f"grad_error_slope{suffix}"] = [
            float(np.polyfit(np.log(draws), np.log(errors), 1)[0]) for errors, _ in reps[normalizer]
        ]
    units = {"prompts": prompt_units, "updates": update_units, "replications": {"ps_ppo": replications}}
    medians = {arm: float(np.median(m["peak_activation_mb"])) for arm, m in update_units.items()}
    ids, held_out = unit_ids(cfg, task, sets)
    return SeedRun(
        lr_metrics, series={"curves": curves, "chosen_lr": chosen_lr, "tuning": tuning, "median_peak_mb": medians},
        units=units, unit_ids=ids, held_out=held_out,
        notes={claim: f"seed {cfg.seed}: " + "; ".join(texts) for claim, texts in notes.items()},
    )


def plot(runs: list[SeedRun], result: dict[str, Any], out_dir: Path) -> list[Path]:
    """Validation accuracy against cumulative update tokens and against cumulative update CPU time (first seed)."""
    fig, axes = new_figure(ncols=2, figsize=(10, 4))
    for arm, curve in runs[0].series["curves"].items():
        for ax, k in zip(axes, (0, 1), strict=True):
            ax.plot(
                [p[k] / (1e3 if k == 0 else 1.0) for p in curve], [p[2] for p in curve], marker="o", label=arm
            )
    axes[0].set_xlabel("token positions processed by the updates (cumulative, thousands)")
    axes[1].set_xlabel("CPU seconds of the updates (cumulative)")
    for ax in axes:
        ax.set_ylabel("greedy accuracy (validation prompts)")
    axes[0].legend(fontsize=7)
    return [save_figure(fig, out_dir / f"{result['mode']}_accuracy_vs_tokens.png")]
