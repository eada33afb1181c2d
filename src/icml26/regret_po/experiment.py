"""Reproduction of RePO: preference pairs from behaviour policies of different skill, labelled by regret.

**Held-out prompts.** The 1,000 three-term chains of 0..9 are split once per ``lab_seed`` (``chain_pools``) into
three disjoint pools: ``test_pool`` chains (600) for testing, ``val_pool`` chains (150) for validation and the
rest (250) for training. Everything any model trains on (the lab models' SFT data, the preference pairs) comes from
the training pool; each seed draws its validation prompts and its test prompts *without replacement* from their
pools (``seed_prompts``), so a seed's test prompts are distinct and none is a training or validation prompt. The
result records each test prompt's id (``prompt_id``: its text hash) and the ids it trained and tuned on.

The tiny-LM lab (``icml26.common.tiny_lm``) trains, once per ``lab_seed`` and cached, three character-level
Llamas on 3-term addition chains of the training pool with a scratchpad (``3+5+2=`` -> ``3+5=8;8+2=10``):

- the starting policy pi_0 (SFT on traces with 30 % corrupted steps), also the reference;
- a strong behaviour policy mu_s (5 % corrupted steps, longer SFT) and a weak one mu_w (60 %).

On each seed, for ``n_pairs`` prompts drawn from the training pool, mu_s and mu_w each sample a response
(temperature 1) whose per-token log-probs and top-k tokens are recorded; the pair is labelled by a Bradley-Terry draw on the **oracle
regret** (the share of wrong scratchpad steps, exact here because the optimal continuation is known), not on the
realised outcome; ties are dropped. Every arm (``ARMS``: the NLL term alone, DPO, RPO = DPO + NLL, IPO and SimPO
with and without the NLL term, RePO / RePO_det / RePO-top-k with and without it) trains pi_0 through
``RegretPOTrainer`` on the same pairs, in the same order, for the same steps, at every point of the same grid
(``lr_grid`` x ``beta_grid``), and keeps the point with the best greedy accuracy on validation prompts. Metric:
greedy accuracy on held-out test prompts (the task's verifiable reward), recorded per prompt (0/1, the same
prompts in the same order for every arm, so the claims pair arms by prompt). ``repo_best`` is the RePO variant
with the best validation accuracy. ``sft`` (pi_0) and ``mu_strong`` are the trivial baseline and the ceiling.

Example:
    >>> import dataclasses
    >>> from icml26.regret_po.experiment import PRESETS, run
    >>> cfg = dataclasses.replace(PRESETS["smoke"], n_pairs=16, steps=1, eval_prompts=8, val_prompts=4)
    >>> out = run(cfg)
    >>> out.series["repo_best"] in ("repo", "repo_det", "repo_topk")
    True
    >>> len(out.units["prompts"]["repo_best"]["accuracy"])
    8
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import io
import itertools
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
    completion_batch,
    generate,
    sft_start,
)
from ..common.tuning import Rule, tune_per_arm

#: arm -> (loss_kind, variant, sft_coef, standard beta/alpha); every arm trains through ``RegretPOTrainer``
ARM_SPECS: dict[str, tuple[str, str, float, float]] = {
    "nll": ("nll", "", 1.0, 0.0),  # the NLL term alone: SFT on the chosen responses
    "dpo": ("dpo", "", 0.0, 0.1),
    "rpo": ("dpo", "", 1.0, 0.1),  # RPO = DPO + the chosen NLL
    "ipo": ("ipo", "", 0.0, 0.1),
    "ipo_nll": ("ipo", "", 1.0, 0.1),
    "simpo": ("simpo", "", 0.0, 2.0),
    "simpo_nll": ("simpo", "", 1.0, 2.0),
    "repo": ("repo", "sampled", 1.0, 0.1),  # official c_sft = 1, alpha = 0.1
    "repo_nonll": ("repo", "sampled", 0.0, 0.1),
    "repo_det": ("repo", "det", 1.0, 0.1),
    "repo_det_nonll": ("repo", "det", 0.0, 0.1),
    "repo_topk": ("repo", "topk", 1.0, 0.1),
    "repo_topk_nonll": ("repo", "topk", 0.0, 0.1),
}
ARMS = tuple(ARM_SPECS)
#: the RePO variants (with the NLL term) among which ``repo_best`` is chosen on the validation prompts
REPO_VARIANTS = ("repo", "repo_det", "repo_topk")
#: the lab models, in the order of ``Config.sft_steps`` / ``Config.sft_noise``
LAB_ROLES = ("pi0", "mu_strong", "mu_weak")
#: SFT examples of each lab model (drawn with replacement from the training pool)
LAB_SFT_EXAMPLES = 3000


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
    top_k: int = 5
    """behaviour top-k tokens stored per completion token (RePO-top-k)"""
    steps: int = 32
    """preference-optimisation steps per arm and grid point (the same budget for every arm)"""
    batch_size: int = 16
    """pairs per step"""
    lr_grid: tuple[float, ...] = (1e-4, 1e-3)
    """AdamW learning rates tried for every arm (linear decay, TRL's default schedule)"""
    beta_grid: tuple[float, ...] = (1.0,)
    """multipliers of each arm's standard beta (DPO/RPO/IPO 0.1, SimPO 2, RePO's alpha 0.1) tried for every arm
    that has one; the NLL-only arm has none"""
    val_prompts: int = 100
    """validation prompts (distinct, drawn from the validation pool) on which each arm's grid point is chosen"""
    eval_prompts: int = 300
    """held-out test prompts for greedy accuracy (distinct, drawn from the test pool)"""
    test_pool: int = 600
    """chains held out for testing, fixed per ``lab_seed`` (never trained or tuned on)"""
    val_pool: int = 150
    """chains held out for validation, fixed per ``lab_seed``; the remaining chains are the training pool"""


PRESETS: dict[str, Config] = {
    "smoke": Config(n_pairs=48, steps=2, lr_grid=(5e-4,), val_prompts=16, eval_prompts=24),
    "quick": Config(),
    "full": Config(
        n_pairs=800,
        beta_grid=(1.0, 3.0),
        val_prompts=150,
        eval_prompts=600,
    ),
}


def prompt_id(prompt: str) -> str:
    """A prompt's id: the first 12 hex digits of the SHA-1 of its text (the same chain, the same id)."""
    return hashlib.sha1(prompt.encode()).hexdigest()[:12]


def chain_pools(cfg: Config) -> dict[str, list[str]]:
    """Every chain of ``cfg.terms`` terms in 0..``cfg.max_value``, split once per ``lab_seed`` into disjoint pools:
    ``"test"`` (``test_pool`` chains), ``"validation"`` (``val_pool``) and ``"train"`` (the rest).

    Raises:
        ValueError: the held-out pools leave no training chains.
    """
    space = ["+".join(map(str, v)) + "=" for v in itertools.product(range(cfg.max_value + 1), repeat=cfg.terms)]
    if cfg.test_pool < 1 or cfg.val_pool < 1 or cfg.test_pool + cfg.val_pool >= len(space):
        raise ValueError(f"test_pool ({cfg.test_pool}) and val_pool ({cfg.val_pool}) must be positive and leave "
                         f"training chains among the {len(space)}")
    order = np.random.default_rng([cfg.lab_seed, 24]).permutation(len(space))
    test, val = order[: cfg.test_pool], order[cfg.test_pool : cfg.test_pool + cfg.val_pool]
    train = order[cfg.test_pool + cfg.val_pool :]
    return {"train": [space[i] for i in train], "validation": [space[i] for i in val], "test": [space[i] for i in test]}


def sft_data(cfg: Config, role: str) -> tuple[list[str], list[str]]:
    """(prompts, noisy completions) a lab model (``LAB_ROLES``) is SFT'd on: chains of the training pool."""
    task = AdditionChain(cfg.terms, cfg.max_value)
    noise = cfg.sft_noise[LAB_ROLES.index(role)]
    pool = chain_pools(cfg)["train"]
    rng = np.random.default_rng([cfg.lab_seed, len(role)])
    examples = [task.solve(pool[i]) for i in rng.integers(0, len(pool), size=LAB_SFT_EXAMPLES)]
    return [e.prompt for e in examples], [task.noisy_completion(e, rng, noise) for e in examples]


def seed_prompts(cfg: Config) -> dict[str, list[str]]:
    """One seed's prompts: ``"pairs"`` (``n_pairs``, drawn with replacement from the training pool),
    ``"validation"`` (``val_prompts``) and ``"test"`` (``eval_prompts``), each drawn without replacement from its
    held-out pool.

    Raises:
        ValueError: more validation or test prompts than their pool holds.
    """
    pools = chain_pools(cfg)
    if not 1 <= cfg.eval_prompts <= len(pools["test"]) or not 1 <= cfg.val_prompts <= len(pools["validation"]):
        raise ValueError(f"eval_prompts ({cfg.eval_prompts}) and val_prompts ({cfg.val_prompts}) must be in "
                         f"[1, test_pool = {cfg.test_pool}] and [1, val_pool = {cfg.val_pool}]")
    pairs = np.random.default_rng([cfg.seed, 1]).integers(0, len(pools["train"]), size=cfg.n_pairs)
    val = np.random.default_rng([cfg.seed, 2]).choice(len(pools["validation"]), cfg.val_prompts, replace=False)
    test = np.random.default_rng([cfg.seed, 3]).choice(len(pools["test"]), cfg.eval_prompts, replace=False)
    return {
        "pairs": [pools["train"][i] for i in pairs],
        "validation": [pools["validation"][i] for i in val],
        "test": [pools["test"][i] for i in test],
    }


def lab_models(cfg: Config) -> tuple[Any, Any, Any, Any]:
    """(tokenizer, pi_0, mu_s, mu_w): SFT'd on noisy traces of the training pool (``sft_data``); cached by
    everything that determines them."""
    task = AdditionChain(cfg.terms, cfg.max_value)
    models = []
    for role, steps, noise in zip(LAB_ROLES, cfg.sft_steps, cfg.sft_noise, strict=True):
        key = {
            "paper": "regret_po",
            "role": role,
            "task": [task.name, cfg.terms, cfg.max_value],
            "steps": steps,
            "noise": noise,
            "hidden": cfg.hidden,
            "seed": cfg.lab_seed,
            "pools": ["train pool only", cfg.test_pool, cfg.val_pool, LAB_SFT_EXAMPLES],
        }

        model, tok = sft_start(key, lambda role=role: sft_data(cfg, role), steps=steps, hidden=cfg.hidden,
                               seed=cfg.lab_seed, desc=f"sft {role}")
        models.append(model)
    return (tok, *models)


def correctness(
    model: Any, tok: Any, task: Task, prompts: list[str], max_new_tokens: int = 16
) -> list[float]:
    """Per-prompt greedy correctness (1.0 / 0.0, in the order of ``prompts``); its mean is ``tiny_lm.accuracy``."""
    completions = generate(model, tok, prompts, max_new_tokens=max_new_tokens)
    return [float(task.reward(p, c)) for p, c in zip(prompts, completions, strict=True)]


def _sample(
    model: Any, tok: Any, prompts: list[str], seed: int, top_k: int
) -> tuple[list[str], list[list[float]], list[list[list[int]]], list[list[list[float]]]]:
    """Sampled completions (temperature 1), their per-token log-probs under the sampling model (EOS included), and
    the sampling model's top-k token ids and log-probs at each completion position."""
    from .trainer import behavior_logps_of

    completions = generate(model, tok, prompts, max_new_tokens=24, temperature=1.0, seed=seed)
    batch = completion_batch(tok, prompts, [c if c else "?" for c in completions])
    rows, ids, vals = behavior_logps_of(model, batch, top_k)
    return completions, rows, ids, vals


def preference_data(
    cfg: Config, tok: Any, mu_s: Any, mu_w: Any, prompts: list[str], seed: int
) -> dict[str, list[Any]]:
    """Pairs (mu_s response, mu_w response) on ``prompts`` labelled by a Bradley-Terry draw on the oracle regret, in
    TRL's preference format plus each side's behaviour log-probs and top-k (``RegretPOTrainer`` columns); ``seed``
    seeds the sampling and the labels."""
    task = AdditionChain(cfg.terms, cfg.max_value)
    rng = np.random.default_rng(seed)
    strong = _sample(mu_s, tok, prompts, seed + 1, cfg.top_k)
    weak = _sample(mu_w, tok, prompts, seed + 2, cfg.top_k)
    cols = ("behavior_logps", "behavior_topk_ids", "behavior_topk_logps")
    out: dict[str, list[Any]] = {
        "prompt": [],
        "chosen": [],
        "rejected": [],
        **{f"{side}_{c}": [] for side in ("chosen", "rejected") for c in cols},
    }
    steps = cfg.terms - 1
    for i, p in enumerate(prompts):
        a, b = strong[0][i], weak[0][i]
        if not a or not b or a == b:
            continue
        # $$\mathrm{regret}(y) = \#\text{wrong scratchpad steps} / \#\text{steps}$$ (exact: the optimum is known)
        ra, rb = task.step_errors(p, a) / steps, task.step_errors(p, b) / steps
        if ra == rb:
            continue
        # $$P(y_a \succ y_b) = \sigma(\beta\,(\mathrm{regret}(y_b) - \mathrm{regret}(y_a)))$$
        a_wins = rng.random() < 1.0 / (1.0 + np.exp(-cfg.label_beta * (rb - ra)))
        win, lose = (strong, weak) if a_wins else (weak, strong)
        out["prompt"].append(p)
        out["chosen"].append(win[0][i])
        out["rejected"].append(lose[0][i])
        for side, src in (("chosen", win), ("rejected", lose)):
            for c, values in zip(cols, src[1:], strict=True):
                out[f"{side}_{c}"].append(values[i])
    return out


def arm_config(arm: str, cfg: Config, lr: float, beta_mult: float, output_dir: str) -> Any:
    """The ``RegretPOConfig`` of one arm at one grid point (same steps, batch, schedule and seed for every arm)."""
    from .trainer import RegretPOConfig

    kind, variant, sft_coef, beta = ARM_SPECS[arm]
    scale = beta * beta_mult
    return RegretPOConfig(
        output_dir=output_dir,
        max_steps=cfg.steps,
        per_device_train_batch_size=cfg.batch_size,
        learning_rate=lr,
        seed=cfg.seed,
        data_seed=cfg.seed,
        report_to="none",
        use_cpu=True,
        logging_steps=10**6,
        save_strategy="no",
        disable_tqdm=True,
        dataloader_num_workers=0,
        loss_kind=kind,
        sft_coef=sft_coef,
        beta=scale if kind in ("dpo", "ipo", "simpo") else 0.1,
        alpha=scale if kind == "repo" else 0.1,
        deterministic=variant == "det",
        topk=variant == "topk",
    )


def train_arm(arm: str, cfg: Config, lr: float, beta_mult: float, tok: Any, pi0: Any, dataset: Any) -> Any:
    """Preference-optimise a copy of pi_0 with ``RegretPOTrainer`` on ``dataset`` (TRL's preference format plus the
    behaviour columns); return the trained policy."""
    import tempfile

    from .trainer import RegretPOTrainer

    with tempfile.TemporaryDirectory(prefix="regret_po_") as out_dir:
        # fresh copies of pi_0 for the policy and the reference: TRL freezes the reference and re-binds its
        # ``forward`` in place, so a model once passed to a trainer must not be copied again (its copy would still
        # run the original's forward)
        policy, ref = copy.deepcopy(pi0).train(), copy.deepcopy(pi0).eval()
        trainer = RegretPOTrainer(
            policy,
            ref_model=ref,
            args=arm_config(arm, cfg, lr, beta_mult, out_dir),
            train_dataset=dataset,
            processing_class=tok,
        )
        with contextlib.redirect_stdout(io.StringIO()):  # the Trainer prints its final logs
            trainer.train()
        final = [h["train_loss"] for h in trainer.state.log_history if "train_loss" in h]
        if final and not np.isfinite(final[-1]):
            raise FloatingPointError(f"{arm}: mean training loss {final[-1]}")
        return trainer.model.eval()


def grid_points(arm: str, cfg: Config) -> list[tuple[float, float]]:
    """(learning rate, beta multiplier) pairs tried for ``arm``: the NLL-only arm has no beta."""
    betas = (1.0,) if ARM_SPECS[arm][0] == "nll" else cfg.beta_grid
    return [(lr, b) for lr in cfg.lr_grid for b in betas]


def run(cfg: Config) -> SeedRun:
    """One seed: fresh pairs; each arm tuned on validation prompts over the same grid; test accuracy per prompt."""
    import datasets

    from ..common.tiny_lm import _quiet_transformers

    _quiet_transformers()
    datasets.disable_progress_bars()
    prompts = seed_prompts(cfg)
    tok, pi0, mu_s, mu_w = lab_models(cfg)
    task = AdditionChain(cfg.terms, cfg.max_value)
    data = preference_data(cfg, tok, mu_s, mu_w, prompts["pairs"], seed=10_000 * (cfg.seed + 1))
    dataset = datasets.Dataset.from_dict(data)
    eval_prompts, val_prompts = prompts["test"], prompts["validation"]
    # what the run trained on (every lab model's SFT data, the pairs kept) and tuned on (the validation prompts)
    trained = {p for role in LAB_ROLES for p in sft_data(cfg, role)[0]} | set(data["prompt"])
    n_pairs = float(len(data["prompt"]))
    # per-prompt 0/1 correctness, the same eval_prompts in the same order for every arm (paired by index)
    per_prompt: dict[str, dict[str, list[float]]] = {
        "sft": {"accuracy": correctness(pi0, tok, task, eval_prompts)},
        "mu_strong": {"accuracy": correctness(mu_s, tok, task, eval_prompts)},
        "mu_weak": {"accuracy": correctness(mu_w, tok, task, eval_prompts)},
    }
    metrics: dict[str, dict[str, float]] = {
        "sft": {"val_accuracy": float(np.mean(correctness(pi0, tok, task, val_prompts))), "pairs": n_pairs}
    }
    grid: dict[str, list[dict[str, float]]] = {}
    grids = {arm: grid_points(arm, cfg) for arm in ARMS}
    bar = progress(total=sum(map(len, grids.values())), desc=f"regret_po seed {cfg.seed}")

    def evaluate(arm: str, point: tuple[float, float], draw: int) -> tuple[float, Any]:
        bar.update()
        lr, b = point
        torch.manual_seed(cfg.seed)
        policy = train_arm(arm, cfg, lr, b, tok, pi0, dataset)
        val = float(np.mean(correctness(policy, tok, task, val_prompts)))
        grid.setdefault(arm, []).append({"lr": lr, "beta_mult": b, "val_accuracy": val})
        return val, policy

    # every arm over its grid points in order; ties keep the earlier (smaller) learning rate
    tuned = tune_per_arm(grids, evaluate, Rule(draws=1, maximize=True, ties="first"))
    bar.close()
    best = {arm: (r["scores"][r["grid"].index(r["chosen"])], tuned.kept[arm], *r["chosen"])
            for arm, r in tuned.record.items()}
    for arm in ARMS:
        val, policy, lr, b = best[arm]
        per_prompt[arm] = {"accuracy": correctness(policy, tok, task, eval_prompts)}
        metrics[arm] = {"val_accuracy": val, "lr": lr, "beta_mult": b, "pairs": n_pairs}
    # the best RePO variant (with the NLL term), chosen on the validation prompts only
    chosen = max(REPO_VARIANTS, key=lambda a: (best[a][0], -REPO_VARIANTS.index(a)))
    per_prompt["repo_best"] = dict(per_prompt[chosen])
    metrics["repo_best"] = {**metrics[chosen], "variant": float(REPO_VARIANTS.index(chosen))}
    return SeedRun(
        metrics,
        series={
            "grid": grid,
            "tuning": tuned.record,
            "repo_best": chosen,
            "lr_grid": list(cfg.lr_grid),
            "beta_grid": list(cfg.beta_grid),
        },
        units={"prompts": per_prompt},
        unit_ids={"prompts": [prompt_id(p) for p in eval_prompts]},
        held_out={"prompts": {"train": sorted(prompt_id(p) for p in trained),
                              "validation": sorted({prompt_id(p) for p in val_prompts})}},
    )


def plot(runs: list[SeedRun], result: dict[str, Any], out_dir: Path) -> list[Path]:
    """Test accuracy of every tuned arm (mean over seeds) beside the SFT start and the strong behaviour policy; and
    every grid point's validation accuracy (mean over seeds), the numbers each arm's choice was made on."""
    fig, ax = new_figure()
    arms = ["sft", "mu_strong", *ARMS, "repo_best"]
    means = [float(np.mean([np.mean(r.units["prompts"][a]["accuracy"]) for r in runs])) for a in arms]
    ax.barh(range(len(arms)), means, color=["grey", "grey", *["C0"] * len(ARMS), "C3"])
    ax.set_yticks(range(len(arms)), arms, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("greedy accuracy (held-out test prompts), tuned on validation prompts")
    paths = [save_figure(fig, out_dir / f"{result['mode']}_tuned_accuracy.png")]
    fig, ax = new_figure()
    points = [(g["lr"], g["beta_mult"]) for g in runs[0].series["grid"][ARMS[1]]]
    for lr, b in points:

        def val(run: SeedRun, arm: str, lr: float = lr, b: float = b) -> float:
            # the NLL-only arm has no beta: its point at this learning rate
            return next(
                g["val_accuracy"]
                for g in run.series["grid"][arm]
                if g["lr"] == lr and (g["beta_mult"] == b or ARM_SPECS[arm][0] == "nll")
            )

        vals = [float(np.mean([val(r, a) for r in runs])) for a in ARMS]
        ax.plot(vals, range(len(ARMS)), marker="o", linestyle="", label=f"lr {lr:g}, beta x{b:g}")
    ax.set_yticks(range(len(ARMS)), list(ARMS), fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("validation accuracy per grid point")
    ax.legend(fontsize=7)
    paths.append(save_figure(fig, out_dir / f"{result['mode']}_grid.png"))
    return paths
