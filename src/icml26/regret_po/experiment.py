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
realised outcome; ties are dropped. Every arm (``ARMS``: the NLL term alone, DPO, RPO = TRL's ``["sigmoid", "sft"]``
with the token-pooled NLL, ``rpo_seq`` with the per-response NLL, RePO / RePO_det / RePO-top-k with the NLL term and
RePO without it) trains pi_0 through ``RegretPOTrainer`` at a constant learning rate. Each arm's learning rate, beta
multiplier and budget are chosen on validation prompts (``tune``): a hill climb (``climb``) on the lattice
lr = ``lr_start`` * ``grid_ratio``^i, beta x ``grid_ratio``^j that stops only where the chosen point beats a scored
neighbour on each side of both axes (otherwise the result notes it), each point scored by the best checkpoint of its
validation learning curve averaged over ``draws`` data orders. Metric: greedy accuracy on held-out test prompts (the
task's verifiable reward), recorded per prompt (0/1, the same prompts in the same order for every arm, so the claims
pair arms by prompt). ``repo_best`` is the RePO variant with the best validation accuracy. ``sft`` (pi_0) and
``mu_strong`` are the trivial baseline and the ceiling.

Example:
    >>> import dataclasses
    >>> from icml26.regret_po.experiment import PRESETS, run
    >>> cfg = dataclasses.replace(PRESETS["smoke"], n_pairs=16, steps=2, eval_every=1, eval_prompts=8,
    ...                           val_prompts=4)
    >>> out = run(cfg)
    >>> out.series["repo_best"] in ("repo", "repo_det", "repo_topk")
    True
    >>> len(out.units["prompts"]["repo_best"]["accuracy"])
    8
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
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

#: arm -> (loss_kind, variant, sft_coef, standard beta/alpha, NLL pooling); every arm trains through
#: ``RegretPOTrainer``. "token" pools the chosen NLL over the batch's tokens (TRL's ``loss_type=["sigmoid", "sft"]``
#: for RPO; the official RePO trainer's ``GPTLMLoss``); ``rpo_seq`` is RPO with a per-sequence mean (labelled row).
ARM_SPECS: dict[str, tuple[str, str, float, float, str]] = {
    "nll": ("nll", "", 1.0, 0.0, "token"),  # the NLL term alone: SFT on the chosen responses
    "dpo": ("dpo", "", 0.0, 0.1, "token"),
    "rpo": ("dpo", "", 1.0, 0.1, "token"),  # RPO as TRL defines it: DPO + the token-pooled chosen NLL
    "rpo_seq": ("dpo", "", 1.0, 0.1, "sequence"),  # RPO with the NLL averaged per response (second row)
    "repo": ("repo", "sampled", 1.0, 0.1, "token"),  # official c_sft = 1, alpha = 0.1
    "repo_nonll": ("repo", "sampled", 0.0, 0.1, "token"),
    "repo_det": ("repo", "det", 1.0, 0.1, "token"),
    "repo_topk": ("repo", "topk", 1.0, 0.1, "token"),
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
    """seed of the test prompts, the pairs the arms are finally trained on, and their data order"""
    lab_seed: int = 0
    """seed of the SFT'd lab models (pi_0, mu_s, mu_w), trained once and cached"""
    tune_seed: int | None = None
    """seed of the tuning data (pairs, validation prompts, data orders); ``None``: this run's ``seed``. Every seed of
    a mode shares its tuning (memoised in-process); a seed equal to it reuses the tuned checkpoints"""
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
    steps: int = 48
    """cap on the preference-optimisation budget (steps) per arm and grid point; the budget itself is chosen on
    validation among the checkpoints every ``eval_every`` steps (constant learning rate, so a checkpoint at step s
    is the run of s steps)"""
    eval_every: int = 12
    """steps between validation checkpoints (the learning curve)"""
    patience: int = 2
    """checkpoints without a new best validation accuracy after which a run stops (so the chosen budget has a
    scored checkpoint after it); a run that reaches ``steps`` still improving is noted in the result"""
    batch_size: int = 8
    """pairs per step"""
    lr_start: float = 1e-3
    """centre of the learning-rate lattice, lr = lr_start * grid_ratio^i (AdamW, constant schedule)"""
    grid_ratio: float = 10**0.5
    """ratio between neighbouring lattice values of the learning rate and of the beta multiplier"""
    lr_limits: tuple[float, float] = (1e-5, 0.1)
    """the learning rates the search may reach"""
    beta_limits: tuple[float, float] = (0.01, 100.0)
    """the beta multipliers the search may reach (beta x {..., 0.1, 0.32, 1, 3.2, 10, ...})"""
    max_points: int = 12
    """grid points evaluated per arm at most"""
    draws: int = 1
    """data orders per grid point; a point's validation score is the mean over them"""
    val_prompts: int = 100
    """validation prompts (distinct, drawn from the validation pool) on which each arm's grid point is chosen"""
    eval_prompts: int = 300
    """held-out test prompts for greedy accuracy (distinct, drawn from the test pool)"""
    test_pool: int = 600
    """chains held out for testing, fixed per ``lab_seed`` (never trained or tuned on)"""
    val_pool: int = 150
    """chains held out for validation, fixed per ``lab_seed``; the remaining chains are the training pool"""


PRESETS: dict[str, Config] = {
    "smoke": Config(n_pairs=48, steps=4, eval_every=2, max_points=1, val_prompts=16, eval_prompts=24),
    # quick: a coarser lattice (x10) so that the bracketing search of 8 arms fits its 2 minutes
    "quick": Config(steps=80, eval_every=10, grid_ratio=10.0),
    "full": Config(
        tune_seed=100, n_pairs=800, steps=160, eval_every=16, draws=2, val_prompts=150, eval_prompts=600
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


def arm_config(
    arm: str, cfg: Config, lr: float, beta_mult: float, output_dir: str, *, steps: int | None = None, draw: int = 0
) -> Any:
    """The ``RegretPOConfig`` of one arm at one grid point (same budget, batch, schedule and seed for every arm);
    ``draw`` picks the data order (``data_seed = 1000 * seed + draw``)."""
    from .trainer import RegretPOConfig

    kind, variant, sft_coef, beta, pooling = ARM_SPECS[arm]
    scale = beta * beta_mult
    return RegretPOConfig(
        output_dir=output_dir,
        max_steps=cfg.steps if steps is None else steps,
        per_device_train_batch_size=cfg.batch_size,
        learning_rate=lr,
        lr_scheduler_type="constant",
        seed=cfg.seed,
        data_seed=1000 * cfg.seed + draw,
        report_to="none",
        use_cpu=True,
        logging_steps=10**6,
        save_strategy="no",
        disable_tqdm=True,
        dataloader_num_workers=0,
        loss_kind=kind,
        sft_coef=sft_coef,
        nll_pooling=pooling,
        beta=scale if kind in ("dpo", "ipo", "simpo") else 0.1,
        alpha=scale if kind == "repo" else 0.1,
        deterministic=variant == "det",
        topk=variant == "topk",
    )


def train_arm(
    arm: str,
    cfg: Config,
    lr: float,
    beta_mult: float,
    tok: Any,
    pi0: Any,
    dataset: Any,
    *,
    steps: int | None = None,
    draw: int = 0,
    checkpoint: Any = None,
) -> Any:
    """Preference-optimise a copy of pi_0 with ``RegretPOTrainer`` on ``dataset`` (TRL's preference format plus the
    behaviour columns); return the trained policy. ``checkpoint(step, model)`` is called every ``cfg.eval_every``
    steps (the learning curve); training stops early when it returns True."""
    import tempfile

    from transformers import TrainerCallback

    from .trainer import RegretPOTrainer

    class _Every(TrainerCallback):
        def on_step_end(self, args: Any, state: Any, control: Any, model: Any = None, **kw: Any) -> None:
            if checkpoint is not None and state.global_step % cfg.eval_every == 0:
                model.eval()
                if checkpoint(state.global_step, model):
                    control.should_training_stop = True
                model.train()

    with tempfile.TemporaryDirectory(prefix="regret_po_") as out_dir:
        # fresh copies of pi_0 for the policy and the reference: TRL freezes the reference and re-binds its
        # ``forward`` in place, so a model once passed to a trainer must not be copied again (its copy would still
        # run the original's forward)
        policy, ref = copy.deepcopy(pi0).train(), copy.deepcopy(pi0).eval()
        trainer = RegretPOTrainer(
            policy,
            ref_model=ref,
            args=arm_config(arm, cfg, lr, beta_mult, out_dir, steps=steps, draw=draw),
            train_dataset=dataset,
            processing_class=tok,
            callbacks=[_Every()],
        )
        with contextlib.redirect_stdout(io.StringIO()):  # the Trainer prints its final logs
            trainer.train()
        final = [h["train_loss"] for h in trainer.state.log_history if "train_loss" in h]
        if final and not np.isfinite(final[-1]):
            raise FloatingPointError(f"{arm}: mean training loss {final[-1]}")
        return trainer.model.eval()


def lattice_value(start: float, ratio: float, i: int) -> float:
    """The lattice point start * ratio^i, rounded to 3 significant digits (so records and keys are exact)."""
    return float(f"{start * ratio**i:.3g}")


def climb(
    score: Any, n_axes: int, in_range: Any, max_points: int
) -> tuple[tuple[int, ...], dict[tuple[int, ...], float], list[str]]:
    """Hill-climb on an integer lattice from the origin: score the centre and its 2 * ``n_axes`` neighbours, move
    to the best (ties keep the centre, then the first neighbour in order), repeat until the centre beats every
    neighbour. So the chosen point always has a scored value on each side of it on every axis, unless a side lies
    outside ``in_range`` or ``max_points`` ran out; each such case is returned as a note.

    Returns:
        (chosen index, {index: score}, notes)

    Example:
        >>> best, scores, notes = climb(lambda ij: -abs(ij[0] - 2) - abs(ij[1] + 1), 2, lambda ij: True, 30)
        >>> best, notes
        ((2, -1), [])
    """
    scores: dict[tuple[int, ...], float] = {}
    centre = (0,) * n_axes
    notes: list[str] = []
    scores[centre] = score(centre)
    while True:
        moves = []
        for axis in range(n_axes):
            for step in (-1, 1):
                nb = tuple(c + step * (a == axis) for a, c in enumerate(centre))
                if not in_range(nb):
                    notes.append(f"axis {axis}: no lattice point beyond index {centre[axis]} within the limits")
                    continue
                if nb not in scores:
                    if len(scores) >= max_points:
                        notes.append(f"stopped at {max_points} points with neighbour {nb} of {centre} unscored")
                        return centre, scores, notes
                    scores[nb] = score(nb)
                moves.append(nb)
        best = max([centre, *moves], key=lambda ij: scores[ij])  # max keeps the first of equal scores
        if best == centre:
            return centre, scores, notes
        centre, notes = best, []


_TUNED: dict[str, dict[str, Any]] = {}


def tune(cfg: Config, tok: Any, pi0: Any, mu_s: Any, mu_w: Any) -> dict[str, Any]:
    """Every arm's (learning rate, beta multiplier, budget) chosen on validation prompts, on the tuning seed's pairs.

    For each arm, ``climb`` walks the (lr, beta) lattice; a point is trained ``draws`` times (data orders) for
    ``steps`` steps with a validation checkpoint every ``eval_every``; its score is the best checkpoint's mean
    validation accuracy over the draws, and that checkpoint is its budget. Memoised in-process by everything but
    ``seed`` (every seed of a mode shares the tuning). Returns ``{"record", "states", "seed", "validation",
    "trained", "sft_val"}``: the record of every arm (points, curves, chosen, edges, notes) and the chosen
    checkpoint's weights of draw 0.
    """
    import datasets

    if cfg.eval_every < 1 or cfg.steps < cfg.eval_every or min(cfg.draws, cfg.max_points, cfg.patience) < 1:
        raise ValueError(f"steps ({cfg.steps}) must be >= eval_every ({cfg.eval_every}) >= 1, and draws "
                         f"({cfg.draws}), max_points ({cfg.max_points}) and patience ({cfg.patience}) >= 1")
    tseed = cfg.seed if cfg.tune_seed is None else cfg.tune_seed
    tcfg = dataclasses.replace(cfg, seed=tseed)
    key = repr(tcfg)
    if key in _TUNED:
        return _TUNED[key]
    prompts = seed_prompts(tcfg)
    val_prompts = prompts["validation"]
    task = AdditionChain(cfg.terms, cfg.max_value)
    data = preference_data(tcfg, tok, mu_s, mu_w, prompts["pairs"], seed=10_000 * (tseed + 1))
    dataset = datasets.Dataset.from_dict(data)
    sft_val = float(np.mean(correctness(pi0, tok, task, val_prompts)))
    ratio = cfg.grid_ratio
    bar = progress(total=len(ARMS), desc=f"regret_po tuning (seed {tseed})")
    record: dict[str, Any] = {}
    states: dict[str, Any] = {}
    for arm in ARMS:
        has_beta = ARM_SPECS[arm][0] != "nll"
        points: dict[tuple[int, ...], dict[str, Any]] = {}

        def value(ij: tuple[int, ...], has_beta: bool = has_beta) -> tuple[float, float]:
            return lattice_value(cfg.lr_start, ratio, ij[0]), (lattice_value(1.0, ratio, ij[1]) if has_beta else 1.0)

        def in_range(ij: tuple[int, ...], value: Any = value) -> bool:
            lr, b = value(ij)
            return cfg.lr_limits[0] <= lr <= cfg.lr_limits[1] and cfg.beta_limits[0] <= b <= cfg.beta_limits[1]

        def score(ij: tuple[int, ...], arm: str = arm, value: Any = value, points: dict = points) -> float:
            lr, b = value(ij)
            curves, kept = [], {}
            for draw in range(cfg.draws):
                curve: list[float] = []

                def at(step: int, model: Any, curve: list[float] = curve, draw: int = draw) -> bool:
                    curve.append(float(np.mean(correctness(model, tok, task, val_prompts))))
                    if draw == 0:
                        kept[step] = {k: v.detach().clone() for k, v in model.state_dict().items()}
                    # early stopping: `patience` checkpoints without a new best (argmax keeps the first best)
                    return len(curve) - 1 - int(np.argmax(curve)) >= cfg.patience

                torch.manual_seed(tseed)
                train_arm(arm, tcfg, lr, b, tok, pi0, dataset, draw=draw, checkpoint=at)
                curves.append(curve)
            # the mean over draws on the checkpoints every draw reached (each stops on its own curve)
            mean = [float(np.mean(col)) for col in zip(*curves, strict=False)]
            best = int(np.argmax(mean))  # the earliest checkpoint among equals
            step = (best + 1) * cfg.eval_every
            points[ij] = {"lr": lr, "beta_mult": b, "val_accuracy": mean[best], "steps": step, "curve": mean,
                          "state": kept[step]}
            return mean[best]

        chosen, _, notes = climb(score, 2 if has_beta else 1, in_range, cfg.max_points)
        pick = points[chosen]
        if pick["steps"] == len(pick["curve"]) * cfg.eval_every:
            notes.append(f"budget: the last checkpoint scored ({pick['steps']} steps) was chosen; validation "
                         "accuracy may still rise beyond it")
        states[arm] = pick.pop("state")
        for p in points.values():
            p.pop("state", None)
        record[arm] = {
            "chosen": {"lr": pick["lr"], "beta_mult": pick["beta_mult"], "steps": pick["steps"]},
            "val_accuracy": pick["val_accuracy"],
            "curve": pick["curve"],
            "points": [dict(p) for p in points.values()],
            "notes": notes,
            "at_edge": bool(notes),
        }
        bar.update()
    bar.close()
    out = {"record": record, "states": states, "seed": tseed, "validation": val_prompts,
           "trained": set(data["prompt"]), "n_pairs": len(data["prompt"]), "sft_val": sft_val}
    _TUNED.clear()  # keep one mode's tuning only
    _TUNED[key] = out
    return out


def run(cfg: Config) -> SeedRun:
    """One seed: every arm at its tuned (lr, beta, budget) trained on this seed's pairs; test accuracy per prompt."""
    import datasets

    from ..common.tiny_lm import _quiet_transformers

    _quiet_transformers()
    datasets.disable_progress_bars()
    prompts = seed_prompts(cfg)
    tok, pi0, mu_s, mu_w = lab_models(cfg)
    task = AdditionChain(cfg.terms, cfg.max_value)
    tuned = tune(cfg, tok, pi0, mu_s, mu_w)
    record = tuned["record"]
    eval_prompts = prompts["test"]
    if cfg.seed == tuned["seed"]:
        data_prompts, dataset, n_pairs = sorted(tuned["trained"]), None, float(tuned["n_pairs"])
    else:
        data = preference_data(cfg, tok, mu_s, mu_w, prompts["pairs"], seed=10_000 * (cfg.seed + 1))
        data_prompts, dataset = data["prompt"], datasets.Dataset.from_dict(data)
        n_pairs = float(len(data_prompts))
    # what the run trained on (every lab model's SFT data, the tuning pairs, this seed's pairs) and tuned on
    trained = {p for role in LAB_ROLES for p in sft_data(cfg, role)[0]} | tuned["trained"] | set(data_prompts)
    # per-prompt 0/1 correctness, the same eval_prompts in the same order for every arm (paired by index)
    per_prompt: dict[str, dict[str, list[float]]] = {
        "sft": {"accuracy": correctness(pi0, tok, task, eval_prompts)},
        "mu_strong": {"accuracy": correctness(mu_s, tok, task, eval_prompts)},
        "mu_weak": {"accuracy": correctness(mu_w, tok, task, eval_prompts)},
    }
    metrics: dict[str, dict[str, float]] = {"sft": {"val_accuracy": tuned["sft_val"], "pairs": n_pairs}}
    notes: list[str] = []
    for arm in ARMS:
        c = record[arm]["chosen"]
        if dataset is None:  # the tuning seed: its chosen checkpoint (draw 0) is this run's model
            policy = copy.deepcopy(pi0)
            policy.load_state_dict(tuned["states"][arm])
            policy.eval()
        else:
            torch.manual_seed(cfg.seed)
            policy = train_arm(arm, cfg, c["lr"], c["beta_mult"], tok, pi0, dataset, steps=c["steps"])
        per_prompt[arm] = {"accuracy": correctness(policy, tok, task, eval_prompts)}
        metrics[arm] = {"val_accuracy": record[arm]["val_accuracy"], "lr": c["lr"], "beta_mult": c["beta_mult"],
                        "steps": float(c["steps"]), "pairs": n_pairs,
                        "at_edge": float(record[arm]["at_edge"])}
        notes += [f"{arm}: {n}" for n in record[arm]["notes"]]
    # the best RePO variant (with the NLL term), chosen on the validation prompts only
    chosen = max(REPO_VARIANTS, key=lambda a: (record[a]["val_accuracy"], -REPO_VARIANTS.index(a)))
    per_prompt["repo_best"] = dict(per_prompt[chosen])
    metrics["repo_best"] = {**metrics[chosen], "variant": float(REPO_VARIANTS.index(chosen))}
    summary = "; ".join(
        f"{arm} lr {record[arm]['chosen']['lr']:g}, beta x{record[arm]['chosen']['beta_mult']:g}, "
        f"{record[arm]['chosen']['steps']} steps" for arm in ARMS)
    edge = (" Grid edges (automatic): " + " | ".join(notes)) if notes else (
        " No chosen constant is on an edge: every arm has a scored value on each side of its learning rate and "
        "beta, and a checkpoint after its budget.")
    return SeedRun(
        metrics,
        series={
            "tuning": record,
            "repo_best": chosen,
            "tune_seed": tuned["seed"],
            "eval_every": cfg.eval_every,
        },
        notes={"vs_rpo": f"Tuned on validation prompts (seed {tuned['seed']}'s pairs, {cfg.draws} data order(s) per "
                         f"point): {summary}.{edge}"},
        units={"prompts": per_prompt},
        unit_ids={"prompts": [prompt_id(p) for p in eval_prompts]},
        held_out={"prompts": {"train": sorted(prompt_id(p) for p in trained),
                              "validation": sorted({prompt_id(p) for p in tuned["validation"]})}},
    )


def plot(runs: list[SeedRun], result: dict[str, Any], out_dir: Path) -> list[Path]:
    """Test accuracy of every tuned arm (mean over seeds) beside the SFT start and the strong behaviour policy; and
    each arm's validation learning curve at its chosen (lr, beta), from the SFT start (step 0)."""
    fig, ax = new_figure()
    arms = ["sft", "mu_strong", *ARMS, "repo_best"]
    means = [float(np.mean([np.mean(r.units["prompts"][a]["accuracy"]) for r in runs])) for a in arms]
    ax.barh(range(len(arms)), means, color=["grey", "grey", *["C0"] * len(ARMS), "C3"])
    ax.set_yticks(range(len(arms)), arms, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("greedy accuracy (held-out test prompts), tuned on validation prompts")
    paths = [save_figure(fig, out_dir / f"{result['mode']}_tuned_accuracy.png")]
    fig, ax = new_figure()
    record, sft_val = runs[0].series["tuning"], runs[0].metrics["sft"]["val_accuracy"]
    for i, arm in enumerate(ARMS):
        curve = record[arm]["curve"]
        every = runs[0].series["eval_every"]
        c = record[arm]["chosen"]
        ax.plot([0, *[every * (j + 1) for j in range(len(curve))]], [sft_val, *curve], marker=".",
                color=f"C{i}", label=f"{arm} (lr {c['lr']:g}, beta x{c['beta_mult']:g})")
        ax.axvline(c["steps"], color=f"C{i}", alpha=0.2)
    ax.axhline(sft_val, color="grey", linestyle="--", label="SFT start")
    ax.set_xlabel("preference-optimisation steps (tuning seed; vertical lines: chosen budget)")
    ax.set_ylabel("validation accuracy (mean over data orders)")
    ax.legend(fontsize=6)
    paths.append(save_figure(fig, out_dir / f"{result['mode']}_learning_curves.png"))
    return paths
