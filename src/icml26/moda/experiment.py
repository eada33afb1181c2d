"""Reproduction of MoDA: fine-grained VQA on scenes whose patches each hold two objects (entangled tokens).

The world (``Config`` defaults): 2 x 2 patches, a one-layer Llama of width 64 (capacity-limited on purpose),
500 stage-2 steps of 64 scenes; ``depths`` reruns some arms with other LM depths (full: two layers).

The vision-language lab (``icml26.common.tiny_vlm``) builds once per ``lab_seed`` and caches a real HF
``LlavaForConditionalGeneration`` (tiny SigLIP tower pretrained on per-patch attributes and frozen, LLaVA
projector, tiny Llama) through the frozen-encoder pretraining and LLaVA stage 1 (captions: "describe patch 3" ->
"red square and blue circle"). Stage 2 (instruction tuning on "what color is the left object in patch 3" ->
"red") then starts from that one checkpoint for every arm, with the same budget, the same batches and the same
test items:

- ``none``: no adapter (plain LLaVA);
- ``mlp``: a text-free residual MLP on the visual tokens, as many parameters as MoDA;
- ``selfgate``: the paper's "self-attention (no text)" ablation, MoDA's modules with the visual tokens as memory;
- ``film``: FiLM from the mean instruction embedding, as many parameters as MoDA;
- ``additive``: Q-Former-style additive cross-attention ``V + W F(T, V)``, MoDA's modules added, not gated;
- ``moda``: ``V * sigmoid(W F(T, V))``, attached with ``attach_moda`` (instruction = prompt tokens only).

Every adapter goes through the same ``attach_moda`` hook. Each arm's stage-2 learning rate is chosen at each
depth it runs at from ``lr_grid`` (bracketed: an edge choice extends the grid, ``lr_extend``) by its mean accuracy
on a validation split (its own scenes) over ``val_draws`` training runs, once per configuration, and cached; the
seeds then rerun every arm at its chosen rate on fresh batches, adapter initialisations and test items. The choice
is in the result (``lr``, ``val_accuracy``, ``val_accuracy_draw<k>``, ``lr_at_edge``). Metrics, per
test item so the claims pair arms by item (pooled over seeds): ``accuracy`` (exact match of the one-word answer,
under teacher forcing = greedy decoding), ``entangled_accuracy`` (the items where the other object of the same
patch differs in the asked attribute), ``pair_accuracy`` on MMVP-style pairs (two scenes differing only in the
asked attribute; a pair counts when both answers are right). Two reference arms bracket the world: ``chance``
(always the first colour / shape word: the best answer without the image) and ``probe`` (a linear probe reading the
asked attribute from the asked patch's frozen token with the patch given: the information ceiling).
``paper_scale`` holds MoDA's parameter and FLOP overhead at LLaVA-MoRE's size (``overhead.py``), the arms'
``params`` / ``flops_overhead`` the lab's. ``depths`` adds a sweep of the language model's depth for
``depth_arms`` (plot: the MoDA gap against depth).

Example (the arms and the test items; ``run(PRESETS["smoke"])`` trains them all):
    >>> from icml26.moda.experiment import ARMS, PRESETS, build_test_set, make_arm
    >>> cfg = PRESETS["quick"]
    >>> [type(make_arm(arm, cfg, seed=0)).__name__ for arm in ARMS]
    ['NoneType', 'ResidualMLP', 'SelfAttentionGate', 'FiLM', 'AdditiveCrossAttention', 'MoDAAdapter']
    >>> data = build_test_set(cfg, seed=0, n=6, n_pairs=2)
    >>> data.items[0].prompt, data.items[0].answer, len(data.pair_items)
    ('what shape is the left object in patch 3', 'triangle', 4)
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import itertools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..common.bracketing import tune_bracketed
from ..common.cache import cached_json
from ..common.grid_notes import lr_edge_note
from ..common.plotting import new_figure, save_figure
from ..common.progress import progress
from ..common.results import SeedRun
from ..common.tiny_vlm import (
    COLORS,
    SHAPES,
    LabRecipe,
    SceneSpec,
    encode,
    grid_recipe,
    item_for,
    item_id,
    item_ids,
    lab_vlm,
    make_items,
    mmvp_pairs,
    recording_sampler,
    render,
    sample_scenes,
    score_items,
    train_vlm,
)
from .baselines import AdditiveCrossAttention, FiLM, ResidualMLP, SelfAttentionGate, n_params
from .module import MoDAAdapter

ARMS = ("none", "mlp", "selfgate", "film", "additive", "moda")
#: version of the tuning procedure (bump when a change alters which learning rate an arm would get; 2: validation
#: draws, per-depth choice and bracketing, issue #54)
TUNING_VERSION = 2
#: the claim that carries the note on learning rates still on an edge of their grid
HEADLINE = "vs_textfree_gate"


@dataclass
class Config:
    """Settings of one seed's run (``PRESETS`` holds smoke / quick / full)."""

    seed: int = 0
    """seed of the stage-2 batches, the adapters' initialisation and the test items"""
    lab_seed: int = 0
    """seed of the lab checkpoint (encoder, stage 1) and of the learning-rate selection, cached"""
    grid: int = 2
    """patches per image side (grid**2 visual tokens, two objects each)"""
    hidden: int = 64
    """width E of the language model, the projector output and every adapter"""
    layers: int = 1
    """language-model layers of the main comparison (capacity-limited on purpose; ``depths`` sweeps others)"""
    stage1_steps: int = 800
    """LLaVA stage 1 (captions; projector + LM, see the lab) before any adapter exists"""
    steps: int = 500
    """stage-2 steps, the same for every arm (at 250 one training run's outcome was mostly luck: see README)"""
    batch_size: int = 64
    """scenes per step"""
    lr_grid: tuple[float, ...] = (2e-3, 4e-3, 8e-3, 1.6e-2)
    """stage-2 peak learning rates tried for every arm at every depth (increasing, at least two; chosen on the
    validation split)"""
    val_draws: int = 2
    """validation draws per (arm, rate, depth): draw ``k`` is its own training run (batches and adapter
    initialisation from seed ``20_000 + lab_seed + k``) scored on the same validation questions; a rate's score is
    the mean over its draws (one run's luck decides no rate, and the second draw breaks ties)"""
    lr_extend: int = 1
    """how many times a choice on an edge of ``lr_grid`` extends the grid one rate past that edge (the grid's
    first ratio); a choice still on an edge is flagged (``lr_at_edge``) and noted on the headline claim"""
    moda_heads: int = 4
    """MoDA attention heads (official: 16 at E = 4096; head width 16 here)"""
    moda_layers: int = 2
    """MoDA decoder layers (official LLaVA-MoRE: 2)"""
    moda_ff: int = 16
    """MoDA feed-forward width (official: 1024 at E = 4096, the same E/4 ratio)"""
    n_val: int = 500
    """validation questions for the learning-rate choice (lab seed, their own scenes)"""
    n_test: int = 1000
    """test questions per seed (fresh scenes each)"""
    n_pairs: int = 300
    """MMVP-style test pairs per seed"""
    arms: tuple[str, ...] = ARMS
    """arms trained on the test seeds (the learning-rate choice always covers all of ``ARMS``)"""
    depths: tuple[int, ...] = ()
    """further language-model depths for the gap-against-depth sweep (empty: none)"""
    depth_arms: tuple[str, ...] = ("none", "moda")
    """arms rerun at each depth of the sweep, each at its own learning rate chosen at that depth"""
    paper_scale: bool = True
    """measure MoDA's parameter and FLOP overhead at LLaVA-MoRE's size (meta device, a few seconds)"""

    def __post_init__(self) -> None:
        if isinstance(self.val_draws, bool) or not isinstance(self.val_draws, int) or self.val_draws < 1:
            raise ValueError(f"val_draws must be an int >= 1, got {self.val_draws!r}")
        if isinstance(self.lr_extend, bool) or not isinstance(self.lr_extend, int) or self.lr_extend < 0:
            raise ValueError(f"lr_extend must be a non-negative int, got {self.lr_extend!r}")
        grid = [float(v) for v in self.lr_grid]
        if len(grid) < 2 or not all(np.isfinite(v) and v > 0 for v in grid) or any(
                b <= a for a, b in itertools.pairwise(grid)):
            raise ValueError(f"lr_grid must hold at least two increasing positive rates, got {self.lr_grid!r}")


PRESETS: dict[str, Config] = {
    # smoke: two rates, two draws, no extension (every choice is on an edge and flagged: the code path, not a
    # choice)
    "smoke": Config(stage1_steps=60, steps=20, n_val=64, n_test=96, n_pairs=32, lr_grid=(3e-3, 6e-3), lr_extend=0,
                    paper_scale=False, depths=(2,), depth_arms=("none", "moda")),
    # quick runs the headline arms on two seeds disjoint from full's (0, 1 against 100-104), without the depth
    # sweep: the same world, checkpoint and learning-rate choice. Two seeds, not one: a one-layer LM's training
    # run varies by more than the claims' effects, and only several seeds let the checks see it (see README)
    "quick": Config(arms=("none", "selfgate", "moda")),
    "full": Config(n_test=2000, n_pairs=600, depths=(2,)),
}


# ------------------------------------------------------------------------------------------------------ the lab
def recipe(cfg: Config, layers: int | None = None) -> LabRecipe:
    """The lab checkpoint every arm starts from (encoder pretrained and frozen, LLaVA stage 1 done)."""
    return grid_recipe(cfg.grid, cfg.hidden, cfg.layers if layers is None else layers, attn_implementation="sdpa",
                       stage1_steps=cfg.stage1_steps, batch_size=cfg.batch_size, seed=cfg.lab_seed)


def make_arm(arm: str, cfg: Config, seed: int) -> torch.nn.Module | None:
    """The adapter of ``arm`` (``None`` for ``none``), initialised from ``seed``."""
    if arm not in ARMS:
        raise ValueError(f"arm must be one of {ARMS}, got {arm!r}")
    if arm == "none":
        return None
    kw = dict(num_heads=cfg.moda_heads, num_layers=cfg.moda_layers, ff_dim=cfg.moda_ff)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        size = n_params(MoDAAdapter(cfg.hidden, **kw))
        torch.manual_seed(seed)
        if arm == "moda":
            return MoDAAdapter(cfg.hidden, **kw)
        if arm == "selfgate":
            return SelfAttentionGate(cfg.hidden, **kw)
        if arm == "additive":
            return AdditiveCrossAttention(cfg.hidden, **kw)
        if arm == "mlp":
            return ResidualMLP(cfg.hidden, target_params=size)
        return FiLM(cfg.hidden, target_params=size)


def _recording_sampler(tok: Any, scenes: SceneSpec, batch_size: int, record: set[str] | None) -> Any:
    """``recording_sampler`` of the stage-2 questions (``"attribute"``)."""
    return recording_sampler(tok, scenes, "attribute", batch_size, record)


def train_arm(arm: str, cfg: Config, lr: float, seed: int, layers: int | None = None,
              record: set[str] | None = None) -> tuple[Any, Any, Any]:
    """``(model, tokenizer, adapter)``: the lab checkpoint with ``arm`` attached, after stage 2 at ``lr``
    (``record``: a set that receives the ids of the stage-2 training questions, ``item_id``)."""
    from .hf import attach_moda

    model, tok = lab_vlm(recipe(cfg, layers), desc=None)
    adapter = make_arm(arm, cfg, seed)
    if adapter is not None:
        attach_moda(model, adapter)
    scenes = SceneSpec(grid=cfg.grid)
    train_vlm(model, _recording_sampler(tok, scenes, cfg.batch_size, record), steps=cfg.steps,
              trainable="projector+lm", extra_params=() if adapter is None else adapter.parameters(), lr=lr,
              seed=seed, desc=None)
    return model, tok, adapter


def _scores(model: Any, tok: Any, scenes: SceneSpec, attrs: np.ndarray, items: list, seed: int
            ) -> np.ndarray:
    """Per-item exact match, batched (images rendered with ``seed``: identical for every arm)."""
    images = render(scenes, attrs, np.random.default_rng(seed))
    out = []
    for i in range(0, len(items), 256):
        batch = encode(tok, items[i:i + 256], scenes, None, images=images[i:i + 256])
        out.append(score_items(model, batch)[0])
    return np.concatenate(out)


@dataclass
class EvalSet:
    """One seed's test items: independent questions and MMVP-style pairs."""

    attrs: np.ndarray
    items: list
    pair_attrs: np.ndarray
    pair_items: list


def build_test_set(cfg: Config, seed: int, n: int, n_pairs: int) -> EvalSet:
    scenes = SceneSpec(grid=cfg.grid)
    rng = np.random.default_rng([seed, 77])
    attrs = sample_scenes(scenes, rng, n)
    items = make_items(scenes, attrs, rng, "attribute")
    pair_attrs, pair_items = mmvp_pairs(scenes, rng, n_pairs, "attribute")
    return EvalSet(attrs, items, pair_attrs, pair_items)


def validation_set(cfg: Config) -> EvalSet:
    """The learning-rate choice's validation questions (lab seed; ``n_val`` of them, their single pair unused)."""
    return build_test_set(cfg, 10_000 + cfg.lab_seed, cfg.n_val, 1)


# ------------------------------------------------------------------------------------------------------ unit ids
def pair_ids(pair_attrs: np.ndarray, pair_items: list) -> list[str]:
    """What an MMVP pair is: a hash of its two scenes and the shared prompt."""
    out = []
    for k in range(len(pair_items) // 2):
        body = np.ascontiguousarray(pair_attrs[2 * k:2 * k + 2], dtype=np.int64).tobytes()
        out.append(hashlib.sha1(body + pair_items[2 * k].prompt.encode()).hexdigest()[:12])
    return out


def _probe_training_scenes(cfg: Config, seed: int, n_train: int) -> tuple[np.ndarray, np.random.Generator]:
    """The probe's training scenes and the generator it goes on with (``probe_outcomes``)."""
    scenes = SceneSpec(grid=cfg.grid)
    rng = np.random.default_rng([seed, 91])
    return sample_scenes(scenes, rng, max(1, n_train // scenes.n_patches)), rng


def probe_training_ids(cfg: Config, seed: int, n_train: int = 2000) -> set[str]:
    """Ids of every attribute question about the probe's training scenes (the probe reads all their patches)."""
    scenes = SceneSpec(grid=cfg.grid)
    train, _ = _probe_training_scenes(cfg, seed, n_train)
    return {item_id(scene, item_for(scenes, scene, "attribute", p, s, a).prompt)
            for scene in train for p in range(scenes.n_patches) for s in range(2) for a in range(2)}


def unit_ids_of(data: EvalSet) -> dict[str, list[str]]:
    """``SeedRun.unit_ids`` of a test set: ``items`` and its ``entangled`` subset by ``item_id``, ``pairs`` by
    ``pair_ids`` (every seed draws fresh scenes, so the ids differ between seeds)."""
    ids = item_ids(data.attrs, data.items)
    ent = [i for i, it in zip(ids, data.items, strict=True) if it.entangled]
    return {"items": ids, "entangled": ent, "pairs": pair_ids(data.pair_attrs, data.pair_items)}


def held_out_of(data: EvalSet, train: set[str], validation: set[str]) -> dict[str, dict[str, list[str]]]:
    """``SeedRun.held_out``: the questions the seed's models (stage 2, the probe) trained on and the learning-rate
    choice's validation questions; a pair counts as trained on (validated on) when one of its scenes' questions
    was."""
    def pairs_in(ids: set[str]) -> list[str]:
        members = item_ids(data.pair_attrs, data.pair_items)
        return [pid for k, pid in enumerate(pair_ids(data.pair_attrs, data.pair_items))
                if members[2 * k] in ids or members[2 * k + 1] in ids]

    items = {"train": sorted(train), "validation": sorted(validation)}
    return {"items": items, "entangled": items,
            "pairs": {"train": pairs_in(train), "validation": pairs_in(validation)}}


def evaluate(model: Any, tok: Any, cfg: Config, data: EvalSet, seed: int) -> dict[str, np.ndarray]:
    """``accuracy`` per item, ``entangled`` per entangled item, ``pair_accuracy`` per MMVP pair."""
    scenes = SceneSpec(grid=cfg.grid)
    acc = _scores(model, tok, scenes, data.attrs, data.items, seed)
    pairs = _scores(model, tok, scenes, data.pair_attrs, data.pair_items, seed + 1).reshape(-1, 2).min(1)
    ent = np.array([it.entangled for it in data.items])
    return {"accuracy": acc, "entangled_accuracy": acc[ent], "pair_accuracy": pairs}


# --------------------------------------------------------------------------------------------- learning rates
def _tuning_key(cfg: Config, layers: int | None = None) -> dict[str, Any]:
    """Everything that decides one validation run at depth ``layers`` (default ``cfg.layers``) but the arm, the
    rate and the draw (test sizes, sweeps and the tuning procedure's own settings excluded)."""
    keep = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)
            if f.name not in ("seed", "n_test", "n_pairs", "arms", "depths", "depth_arms", "paper_scale",
                              "lr_grid", "val_draws", "lr_extend", "layers")}
    return {"paper": "moda", "tuning": TUNING_VERSION, "lab": recipe(cfg, layers).key(), **keep}


def validation_seed(cfg: Config, draw: int) -> int:
    """Training seed of validation draw ``draw`` (batches, adapter initialisation): ``20_000 + lab_seed + draw``,
    apart from every test seed.

    Example:
        >>> validation_seed(PRESETS["quick"], 0), validation_seed(PRESETS["quick"], 1)
        (20000, 20001)
    """
    return 20_000 + cfg.lab_seed + draw


def validation_accuracy(cfg: Config, arm: str, lr: float, layers: int | None = None, draw: int = 0) -> float:
    """Validation accuracy of ``arm`` trained at ``lr`` with a ``layers``-layer LM on draw ``draw``'s batches.

    Every draw scores the same validation questions, rendered alike (``validation_set``); only the training run
    differs. Cached per (arm, rate, depth, draw); a diverged run scores 0.

    Args:
        cfg: the configuration (its lab, budget and validation size).
        arm: one of ``ARMS``.
        lr: the stage-2 peak learning rate.
        layers: language-model depth (``None``: ``cfg.layers``).
        draw: the validation draw (training seed ``validation_seed(cfg, draw)``).
    Returns:
        The exact-match accuracy on ``cfg.n_val`` validation questions.
    """
    depth = cfg.layers if layers is None else layers

    def compute() -> dict[str, float]:
        try:
            model, tok, _ = train_arm(arm, cfg, lr, validation_seed(cfg, draw), layers=depth)
            val = validation_set(cfg)
            acc = float(_scores(model, tok, SceneSpec(grid=cfg.grid), val.attrs, val.items,
                                validation_seed(cfg, 0)).mean())
        except FloatingPointError:  # diverged at this rate: it cannot be chosen
            acc = 0.0
        return {"val_accuracy": acc}

    key = {**_tuning_key(cfg, depth), "arm": arm, "lr": float(lr), "draw": int(draw)}
    return float(cached_json("moda_tuning", key, compute)["val_accuracy"])


def tuned_runs(cfg: Config) -> tuple[tuple[str, str, int], ...]:
    """``(name, arm, layers)`` of every learning rate ``cfg`` needs: each of ``arms`` at ``layers`` (name: the arm)
    and each of ``depth_arms`` at each of ``depths`` (name: ``<arm>_l<depth>``, the sweep's arm).

    Example:
        >>> [name for name, _, _ in tuned_runs(PRESETS["full"])]
        ['none', 'mlp', 'selfgate', 'film', 'additive', 'moda', 'none_l2', 'moda_l2']
    """
    out = [(arm, arm, cfg.layers) for arm in ARMS if arm in cfg.arms]
    out += [(f"{arm}_l{d}", arm, d) for d in cfg.depths for arm in ARMS if arm in cfg.depth_arms]
    return tuple(out)


def tune_arm(cfg: Config, arm: str, layers: int | None = None) -> dict[str, Any]:
    """``arm``'s learning rate at depth ``layers``: the best mean validation accuracy over ``val_draws`` draws.

    ``lr_grid`` is bracketed (``common.bracketing.tune_bracketed``): a choice on an edge adds one rate past it, at
    most ``lr_extend`` times; ties go to the smaller rate.

    Args:
        cfg: the configuration (``lr_grid``, ``val_draws``, ``lr_extend``).
        arm: one of ``ARMS``.
        layers: language-model depth (``None``: ``cfg.layers``).
    Returns:
        ``{"lr", "val_accuracy" (the chosen rate's mean), "val_accuracy_draws" (its per-draw accuracies), "grid",
        "scores" (mean per rate), "at_edge"}``.
    """
    def score(lr: float) -> tuple[float, list[float]]:
        accs = [validation_accuracy(cfg, arm, lr, layers, draw) for draw in range(cfg.val_draws)]
        return float(np.mean(accs)), accs

    rec, draws = tune_bracketed(cfg.lr_grid, score, cfg.lr_extend)
    i = rec["grid"].index(rec["chosen"])
    return {"lr": float(rec["chosen"]), "val_accuracy": float(rec["scores"][i]),
            "val_accuracy_draws": [float(a) for a in draws], "grid": [float(v) for v in rec["grid"]],
            "scores": [float(v) for v in rec["scores"]], "at_edge": bool(rec["at_edge"])}


def tune_learning_rates(cfg: Config) -> dict[str, dict[str, Any]]:
    """``{name: tune_arm(...)}`` for every ``(name, arm, layers)`` of ``tuned_runs(cfg)``.

    Every arm, at every depth, gets the same grid, the same stage-2 budget, the same draws and the same
    validation items; selection uses the lab seed's draws, never the test items. Each (arm, rate, depth, draw)
    run is cached, so widening the grid or adding draws trains only the new runs.
    """
    runs = tuned_runs(cfg)
    return {name: tune_arm(cfg, arm, layers)
            for name, arm, layers in progress(runs, desc="moda lr selection", total=len(runs))}


def tuning_metrics(tuned: dict[str, Any]) -> dict[str, float]:
    """The result's record of one choice: ``lr``, ``val_accuracy`` (mean over draws), ``val_accuracy_draw<k>``
    and ``lr_at_edge`` (1.0 when still on an edge of the grid).

    Example:
        >>> tuning_metrics({"lr": 0.004, "val_accuracy": 0.75, "val_accuracy_draws": [0.5, 1.0], "at_edge": False})
        {'lr': 0.004, 'val_accuracy': 0.75, 'val_accuracy_draw0': 0.5, 'val_accuracy_draw1': 1.0, 'lr_at_edge': 0.0}
    """
    return {"lr": float(tuned["lr"]), "val_accuracy": float(tuned["val_accuracy"]),
            **{f"val_accuracy_draw{k}": float(a) for k, a in enumerate(tuned["val_accuracy_draws"])},
            "lr_at_edge": float(tuned["at_edge"])}


# ----------------------------------------------------------------------------------------- reference arms
def chance_outcomes(items: list) -> np.ndarray:
    """Correctness of the best image-blind answer (the first colour / shape word; answers are uniform)."""
    return np.array([float(it.answer == (COLORS[0] if it.attribute == 0 else SHAPES[0])) for it in items])


@torch.no_grad()
def probe_outcomes(model: Any, cfg: Config, data: EvalSet, seed: int, n_train: int = 2000) -> np.ndarray:
    """Information ceiling: a least-squares linear probe per (side, attribute) reads the answer from the frozen
    token of the asked patch (the patch is given to the probe); per-item correctness."""
    scenes = SceneSpec(grid=cfg.grid)
    tower = model.model.vision_tower.eval()

    def tokens(attrs: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        x = torch.from_numpy(render(scenes, attrs, rng))
        h = tower(x, output_hidden_states=True).hidden_states[-1].double().numpy()
        return np.concatenate([h, np.ones((*h.shape[:2], 1))], axis=-1)

    train, rng = _probe_training_scenes(cfg, seed, n_train)
    xtr = tokens(train, rng)
    xtr = xtr.reshape(-1, xtr.shape[-1])
    ytr = train.reshape(-1, 4)
    weights = [np.linalg.lstsq(xtr, np.eye(4)[ytr[:, j]], rcond=None)[0] for j in range(4)]
    xte = tokens(data.attrs, np.random.default_rng(seed))
    out = []
    for i, it in enumerate(data.items):
        j = 2 * it.side + it.attribute
        out.append(float((xte[i, it.patch] @ weights[j]).argmax() == data.attrs[i, it.patch, it.side, it.attribute]))
    return np.array(out)


def toy_flops(model: Any, tok: Any, cfg: Config) -> float:
    """Forward FLOPs of the model (adapter included) on one test question."""
    from .overhead import count_flops

    scenes = SceneSpec(grid=cfg.grid)
    rng = np.random.default_rng(0)
    attrs = sample_scenes(scenes, rng, 1)
    batch = encode(tok, make_items(scenes, attrs, rng, "attribute"), scenes, attrs, rng)
    return float(count_flops(model, **batch))


@functools.lru_cache(maxsize=1)
def _paper_scale() -> tuple[tuple[str, float], ...]:
    """MoDA's overheads at LLaVA-MoRE's size (deterministic: measured once per process, reused by every seed)."""
    from .overhead import paper_scale_overhead

    inference = paper_scale_overhead(text_tokens=64)
    training = paper_scale_overhead(text_tokens=64, response_tokens=2048 - 576 - 64)
    return (("params_overhead", inference["params_overhead"]), ("flops_overhead", inference["flops_overhead"]),
            ("flops_overhead_2048", training["flops_overhead"]))


# ------------------------------------------------------------------------------------------------------- run
def run(cfg: Config) -> SeedRun:
    """One seed: every arm from the same stage-1 checkpoint at the rate chosen for it at its depth; per-item
    outcomes, each choice's record (``tuning_metrics``) and a note on the headline naming edge choices."""
    unknown = [a for a in (*cfg.arms, *cfg.depth_arms) if a not in ARMS]
    if unknown or "none" not in cfg.arms:
        raise ValueError(f"arms and depth_arms must be among {ARMS} and arms must include 'none', got {unknown}")
    choice = tune_learning_rates(cfg)
    data = build_test_set(cfg, cfg.seed, cfg.n_test, cfg.n_pairs)
    units: dict[str, dict[str, dict[str, list[float]]]] = {"items": {}, "entangled": {}, "pairs": {}}
    metrics: dict[str, dict[str, float]] = {}
    base_flops = None
    gates: dict[str, float] = {}
    trained: set[str] = set()  # every arm trains on the same stream (seed); recorded for each all the same
    order = ["none", *(a for a in cfg.arms if a != "none")]  # the FLOP overheads are relative to "none"
    for arm in progress(order, desc=f"moda seed {cfg.seed}"):
        model, tok, adapter = train_arm(arm, cfg, choice[arm]["lr"], cfg.seed, record=trained)
        out = evaluate(model, tok, cfg, data, 30_000 + cfg.seed)
        if isinstance(adapter, MoDAAdapter) and adapter.last_mask is not None:
            gates[arm] = float(adapter.last_mask.mean())  # on the last evaluation batch
        units["items"][arm] = {"accuracy": out["accuracy"].tolist()}
        units["entangled"][arm] = {"entangled_accuracy": out["entangled_accuracy"].tolist()}
        units["pairs"][arm] = {"pair_accuracy": out["pair_accuracy"].tolist()}
        flops = toy_flops(model, tok, cfg)
        base_flops = flops if arm == "none" else base_flops
        metrics[arm] = {**tuning_metrics(choice[arm]),
                        "params": float(0 if adapter is None else n_params(adapter)),
                        "flops_overhead": flops / base_flops - 1.0}
        if arm == "none":
            units["items"]["chance"] = {"accuracy": chance_outcomes(data.items).tolist()}
            units["items"]["probe"] = {"accuracy": probe_outcomes(model, cfg, data, cfg.seed).tolist()}
    for arm, g in gates.items():
        metrics[arm]["mean_gate"] = g
    for name, arm, layers in tuned_runs(cfg):
        if name == arm:
            continue  # a main arm, trained above
        # the sweep's arm at its own depth's rate (chosen on depth-``layers`` validation runs)
        model, tok, _ = train_arm(arm, cfg, choice[name]["lr"], cfg.seed, layers=layers, record=trained)
        out = evaluate(model, tok, cfg, data, 30_000 + cfg.seed)
        units["items"][name] = {"accuracy": out["accuracy"].tolist()}
        metrics[name] = tuning_metrics(choice[name])
    notes = {}
    if (note := lr_edge_note(cfg.lr_extend, choice)) is not None:
        notes[HEADLINE] = note
    if cfg.paper_scale:
        metrics["paper_scale"] = dict(_paper_scale())
    trained |= probe_training_ids(cfg, cfg.seed)
    validation = validation_set(cfg)
    held = held_out_of(data, trained, set(item_ids(validation.attrs, validation.items)))
    series = {"depths": (cfg.layers, *cfg.depths), "lr_tuning": choice}
    return SeedRun(metrics, units=units, series=series, notes=notes, unit_ids=unit_ids_of(data), held_out=held)


def plot(runs: list[SeedRun], result: dict[str, Any], out_dir: Path) -> list[Path]:
    """Accuracy of each arm (mean over seeds, items pooled) and, with a depth sweep, the MoDA gap against depth."""
    arms = result["arms"]
    paths = []
    fig, ax = new_figure()
    names = [a for a in ("chance", *ARMS, "probe") if a in arms]
    for i, name in enumerate(names):
        stat = arms[name]["accuracy"]
        ax.bar(i, stat["mean"], yerr=stat["std"], color="C3" if name == "moda" else "C0")
    ax.set_xticks(range(len(names)), names, rotation=30, fontsize=8)
    ax.set_ylabel("test accuracy (exact match)")
    ax.set_ylim(0, 1)
    paths.append(save_figure(fig, out_dir / f"{result['mode']}_accuracy_by_arm.png"))
    depths = runs[0].series.get("depths", ())
    if len(depths) > 1:
        main = depths[0]
        fig, ax = new_figure()
        for other in [a for a in ARMS if a != "moda"]:
            gaps = []
            for d in sorted(depths):
                m, b = ("moda", other) if d == main else (f"moda_l{d}", f"{other}_l{d}")
                if m in arms and b in arms:
                    gaps.append((d, arms[m]["accuracy"]["mean"] - arms[b]["accuracy"]["mean"]))
            if len(gaps) > 1:
                ax.plot(*zip(*gaps, strict=True), marker="o", label=f"moda - {other}")
        ax.axhline(0.0, color="grey", lw=0.8)
        ax.set_xlabel("language-model layers")
        ax.set_ylabel("accuracy gap")
        ax.legend(fontsize=7)
        paths.append(save_figure(fig, out_dir / f"{result['mode']}_gap_vs_depth.png"))
    return paths
