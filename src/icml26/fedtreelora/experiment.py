"""Reproduction of FedTreeLoRA on the embedded default: a pretrained tiny Llama and a planted client hierarchy.

1. **The base** (public, central, cached): a 4-layer character-level Llama (``icml26.common.tiny_lm``) pretrained
   on count queries (``data.pretrain_corpus``), then frozen. Its count accuracy is reported (``base``).
2. **The clients** (``data.World``): 8 clients, 2 groups x 2 rules x 2 clients, each answering 0/1 for whether the
   count of the query letter is in its rule's set, flipped for the shared twist letters; train / validation / test
   splits drawn per seed; 4 more clients (one per rule) never train (``World.unseen``).
3. **The depth premise, checked before the federated run**: every client trains its LoRA locally for the
   warm-up's steps (the same batches FedTreeLoRA's warm-up uses); per layer, the silhouette of the planted
   top-level split under the B distances says how client-specific that layer's update is. The premise ("shallow
   layers more shareable") is a higher silhouette in the deep half than in the shallow half (``premise``
   arm; ``random_base``: the same on a randomly initialised base of the same shape, the design notes' inversion).
4. **The arms** (same base, data, seeds, rounds, local steps, rank; ``baselines``): local-only, FedAvg-LoRA,
   FedAvg + local fine-tuning, Ditto, FFA-LoRA, FedSA-LoRA, a fixed-depth split, flat clustering (one partition
   for every layer), FedTreeLoRA, its ablations (fixed k = 4, independent per-layer clustering, no external
   expert), and reference arms: ``oracle_cluster`` (the planted rules known: clustered federation without
   inferring the clusters), the trivial ``base_zero_shot`` and ``majority`` predictors, and ``best_baseline``
   (per seed, the personalised baseline of ``BASELINES`` with the best validation accuracy: the headline's
   comparator). Each arm's learning rate (and Ditto's lambda) is chosen on its clients' mean validation accuracy
   (``tune_arm``, bracketed; the test split is never consulted); clients train in one batched forward pass
   (``core.run_batched``, the same protocol as the federation harness's in-process runner).
   **Unseen clients** (``unseen_outcomes``): personalised from each trained federation with equal local compute.
5. **Units and ids**: ``items`` are (client, test item) pairs, in client order, the same for every arm; an item's
   id is ``c<client>/<prompt>`` (``ClientData.item_ids``: the label follows from the client's rule), so a prompt a
   client meets again is the same unit, and ``held_out`` lists, in the same ids, every client's training items
   and its validation items (which choose each arm's learning rate); the splits are drawn disjoint
   (``data.make_clients``). The base's public pretraining corpus (count queries on the same kind of strings,
   another task and no client) is not a split of these units.
6. **Metrics**: personalised accuracy per (client, test item) (``items``: the paired units of the checks; and
   ``items_unseen``, the unseen clients'), the worst client's accuracy, the chosen cluster count per layer and its
   gap between deep and shallow layers, the adjusted Rand index of the recovered tree against the planted one,
   trainable parameters per client, bytes communicated per round (both directions, all clients), the chosen
   constants (``lr``, ``lam``) and whether they sit on a grid edge, and where the unseen clients were placed.

Example:
    >>> import dataclasses
    >>> from icml26.fedtreelora.experiment import PRESETS, run
    >>> cfg = dataclasses.replace(PRESETS["smoke"], arms=("fedavg_lora", "fedtreelora"))
    >>> out = run(cfg)                                       # doctest: +SKIP
    >>> sorted(out.units["items"])                           # doctest: +SKIP
    ['base_zero_shot', 'fedavg_lora', 'fedtreelora', 'majority']
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..common.bracketing import tune_bracketed
from ..common.plotting import new_figure, save_figure
from ..common.progress import progress
from ..common.results import SeedRun
from .baselines import (
    Ditto,
    FedAvgFT,
    FedAvgLoRA,
    FedSALoRA,
    FFALoRA,
    FixedDepthLoRA,
    FlatClusterLoRA,
    LocalLoRA,
    OracleClusterLoRA,
)
from .core import (
    CLUS,
    EXT,
    FederatedLoRA,
    FedTreeLoRA,
    adjusted_rand,
    factor_of,
    layer_distances,
    layer_index,
    place_client,
    run_batched,
    silhouette,
)
from .data import World, make_clients, pretrain_corpus

#: every federated arm the experiment knows (``Config.arms`` picks from these)
ALL_ARMS = ("local", "fedavg_lora", "fedavg_ft", "ditto", "ffa_lora", "fedsa_lora", "fixed_depth", "flat_cluster",
            "fedtreelora", "fixed_k", "independent_layers", "no_mix", "gate_half", "oracle_cluster")
#: the personalised baselines of the headline: ``best_baseline`` is, per seed, the one of these with the best mean
#: validation accuracy (issue #50 item 3: FedTreeLoRA against the strongest of them, not against FedAvg)
BASELINES = ("local", "fedavg_ft", "ditto", "fixed_depth", "fedsa_lora", "flat_cluster")
#: arms personalised for the unseen clients (``unseen_outcomes``); ``fedavg_ft`` there starts from FedAvg's model
UNSEEN_ARMS = ("fedtreelora", "flat_cluster", "fedavg_ft", "local")
#: the claim whose notes name tuned constants left on a grid edge
HEADLINE = "vs_best_baseline"
#: the arms whose clients mix in an external expert through a gate
GATED = ("fedtreelora", "fixed_k", "independent_layers", "gate_half")
LABELS = ("0", "1")


@dataclass
class Config:
    """Settings of one seed's run (``PRESETS`` holds smoke / quick / full)."""

    seed: int = 0
    """seed of the clients' data, the batch order and nothing else (the base is fixed by ``lab_seed``)"""
    lab_seed: int = 0
    """seed of the pretrained base (trained once and cached)"""
    twist: str = "abcd"
    """the query letters whose label every client flips (``data.World.twist``: the shared structure)"""
    hidden: int = 48
    """width of the base (4 heads, 2 key-value heads, MLP 2 x hidden)"""
    layers: int = 4
    """transformer layers of the base"""
    pretrain_steps: int = 1500
    """central pretraining steps on count queries (batch 32)"""
    pretrain_lr: float = 2e-3
    """pretraining learning rate (AdamW)"""
    n_train: int = 64
    """training examples per client"""
    n_val: int = 64
    """validation examples per client (learning-rate choice)"""
    n_test: int = 200
    """test examples per client (the paired units)"""
    rounds: int = 10
    """communication rounds of training (the same for every arm)"""
    local_steps: int = 8
    """local AdamW steps per round (batch ``batch_size``)"""
    warmup_rounds: int = 5
    """FedTreeLoRA's (and flat clustering's) local-only warm-up rounds before the tree, counted in ``rounds``"""
    batch_size: int = 16
    """examples per local step"""
    rank: int = 4
    """LoRA rank on q_proj and v_proj of every layer"""
    alpha: float = 8.0
    """LoRA alpha (scaling alpha / rank)"""
    lr_grid: tuple[float, ...] = (5e-3, 1e-2, 2e-2)
    """learning rates tried for every arm (``common.bracketing.tune_bracketed``): each arm keeps the one with the
    best mean validation accuracy of its clients, ties to the smaller"""
    lr_extend: int = 2
    """values added past an edge of ``lr_grid`` (and of ``ditto_lams``) when the choice lands on it"""
    ditto_lams: tuple[float, ...] = (0.1, 1.0, 10.0)
    """Ditto's proximal weights lambda tried (each with its own learning-rate search; Ditto's paper's grid spans
    0.05-2)"""
    ft_rounds: int | None = None
    """FedAvg + FT's local fine-tuning rounds at the end of ``rounds`` (default ``warmup_rounds``: as many rounds
    without sharing as FedTreeLoRA's warm-up); also the unseen clients' fine-tuning rounds"""
    unseen: bool = True
    """personalise and test the held-out clients (``World.unseen``) from the trained federation"""
    premise_lr: float = 1e-2
    """learning rate of the depth-premise check (local training for the warm-up's steps)"""
    gate_lr: float = 0.05
    """learning rate of FedTreeLoRA's mixing gates (Adam moves a scalar by about this much per step)"""
    gate_init: float = 0.9
    """FedTreeLoRA's starting lambda (weight of the client's cluster expert); the ``gate_half`` arm starts at 0.5"""
    tau: float = 0.2
    """FedTreeLoRA's no-split score (a split needs a silhouette above it); also flat clustering's"""
    window: int = 3
    """FedTreeLoRA's search window K (the cluster count grows by at most K - 1 per layer)"""
    fixed_k: int = 4
    """cluster count of the ``fixed_k`` ablation (every layer)"""
    share_layers: int = 2
    """layers shared by all in the ``fixed_depth`` split (the shallow half)"""
    arms: tuple[str, ...] = ALL_ARMS
    """federated arms to run (``ALL_ARMS``); ``base_zero_shot`` and ``majority`` are always measured"""
    random_base_check: bool = True
    """also run the depth-premise check on a randomly initialised base"""


#: quick's arms: the headline's (FedTreeLoRA, every baseline of ``BASELINES``), FedAvg and the oracle clusters
QUICK_ARMS = ("local", "fedavg_lora", "fedavg_ft", "ditto", "fixed_depth", "fedsa_lora", "flat_cluster", "fedtreelora",
              "oracle_cluster")

PRESETS: dict[str, Config] = {
    "smoke": Config(pretrain_steps=60, n_train=32, n_val=16, n_test=24, rounds=3, local_steps=2, warmup_rounds=1,
                    lr_grid=(1e-2, 2e-2), lr_extend=0, ditto_lams=(1.0, 10.0), arms=QUICK_ARMS,
                    random_base_check=False),
    "quick": Config(arms=QUICK_ARMS, random_base_check=False),
    "full": Config(rounds=12, local_steps=10, warmup_rounds=4),
}


# ------------------------------------------------------------------------------------------------- the base
def base_model(cfg: Config) -> tuple[Any, Any]:
    """(model, tokenizer): the tiny Llama pretrained on count queries, cached by everything that determines it."""
    from ..common.tiny_lm import cached, char_tokenizer, sft

    world = World()
    key = {"paper": "fedtreelora", "role": "base", "objective": "count_queries_v1", "letters": world.letters,
           "length": world.length, "hidden": cfg.hidden, "layers": cfg.layers, "steps": cfg.pretrain_steps,
           "lr": cfg.pretrain_lr, "batch": 32, "seed": cfg.lab_seed}

    def build() -> tuple[Any, Any]:
        tok = char_tokenizer()
        prompts, answers = pretrain_corpus(world.letters, world.length, np.random.default_rng(cfg.lab_seed), 20000)
        model = _fresh_model(cfg, len(tok))
        sft(model, tok, prompts, answers, steps=cfg.pretrain_steps, batch_size=32, lr=cfg.pretrain_lr,
            seed=cfg.lab_seed, desc="pretrain base")
        return model, tok

    model, tok = cached(key, build)
    _eager(model)
    for p in model.parameters():
        p.requires_grad_(False)
    return model.eval(), tok


def _fresh_model(cfg: Config, vocab: int, seed: int | None = None) -> Any:
    from ..common.tiny_lm import tiny_causal_lm

    model = tiny_causal_lm(vocab, hidden=cfg.hidden, layers=cfg.layers, heads=4, kv_heads=2,
                           intermediate=2 * cfg.hidden, max_positions=32, seed=cfg.lab_seed if seed is None else seed)
    return _eager(model)


def _eager(model: Any) -> Any:
    """Eager attention: at this size it is faster on a CPU than SDPA, and the same on every machine."""
    model.set_attn_implementation("eager")
    return model


@torch.no_grad()
def count_accuracy(model: Any, tok: Any, n: int = 400, seed: int = 12345) -> float:
    """The base's accuracy on fresh count queries (its pretraining objective)."""
    world = World()
    prompts, answers = pretrain_corpus(world.letters, world.length, np.random.default_rng(seed), n)
    ids = torch.tensor([tok(p, add_special_tokens=False)["input_ids"] for p in prompts])
    pred = model(input_ids=ids, logits_to_keep=1).logits[:, -1].argmax(-1).tolist()
    return float(np.mean([tok.convert_ids_to_tokens(i) == a for i, a in zip(pred, answers, strict=True)]))


# ------------------------------------------------------------------------------------------------- the arms
def ft_rounds(cfg: Config) -> int:
    """FedAvg + FT's (and the unseen clients') local fine-tuning rounds: ``cfg.ft_rounds`` or the warm-up's."""
    return cfg.warmup_rounds if cfg.ft_rounds is None else cfg.ft_rounds


def make_algorithm(arm: str, trainer: Any, cfg: Config, lr: float, world: World, lam: float | None = None
                   ) -> FederatedLoRA:
    """The federated algorithm of ``arm`` with this run's shared settings (``lam``: Ditto's proximal weight)."""
    kw: dict[str, Any] = dict(train_rounds=cfg.rounds, local_steps=cfg.local_steps, lr=lr, seed=cfg.seed)
    tree: dict[str, Any] = dict(warmup_rounds=cfg.warmup_rounds, tau=cfg.tau, window=cfg.window, gate_lr=cfg.gate_lr,
                                gate_init=0.5 if arm == "gate_half" else cfg.gate_init)
    if arm == "local":
        return LocalLoRA(trainer, **kw)
    if arm == "fedavg_lora":
        return FedAvgLoRA(trainer, **kw)
    if arm == "fedavg_ft":
        return FedAvgFT(trainer, ft_rounds=ft_rounds(cfg), **kw)
    if arm == "ditto":
        if lam is None:
            raise ValueError("the ditto arm needs lam, its proximal weight")
        return Ditto(trainer, lam=lam, **kw)
    if arm == "ffa_lora":
        return FFALoRA(trainer, **kw)
    if arm == "fedsa_lora":
        return FedSALoRA(trainer, **kw)
    if arm == "fixed_depth":
        return FixedDepthLoRA(trainer, share_layers=cfg.share_layers, **kw)
    if arm == "flat_cluster":
        return FlatClusterLoRA(trainer, warmup_rounds=cfg.warmup_rounds, tau=cfg.tau, **kw)
    if arm == "fedtreelora":
        return FedTreeLoRA(trainer, **tree, **kw)
    if arm == "fixed_k":
        return FedTreeLoRA(trainer, cut_rule="fixed", fixed_k=cfg.fixed_k, **tree, **kw)
    if arm == "independent_layers":
        return FedTreeLoRA(trainer, cut_rule="independent", **tree, **kw)
    if arm == "no_mix":
        return FedTreeLoRA(trainer, external=False, **tree, **kw)
    if arm == "gate_half":
        return FedTreeLoRA(trainer, **tree, **kw)
    if arm == "oracle_cluster":
        return OracleClusterLoRA(trainer, labels=world.planted_labels("subgroup"), **kw)
    raise ValueError(f"unknown arm {arm!r}; choose from {ALL_ARMS}")


def _layer_B(states: list[dict[str, np.ndarray]], keys: list[str], layers: list[int]) -> dict[int, list[list[np.ndarray]]]:
    return {c: [[st[k] for k in keys if factor_of(k) == "B" and layer_index(k) == layer] for layer in layers]
            for c, st in enumerate(states)}


def premise_check(trainer: Any, clients: list[Any], cfg: Config, world: World) -> dict[str, Any]:
    """Local training for the warm-up's steps (the warm-up's batches), then per-layer silhouettes of the planted
    top-level and subgroup splits under the B distances (1 - cos), and their deep-minus-shallow gaps."""
    n = len(clients)
    states = [trainer.init_state() for _ in range(n)]
    mixes: list[dict[str, float]] = [{} for _ in range(n)]
    for rnd in range(1, cfg.warmup_rounds + 1):
        kwargs = [dict(steps=cfg.local_steps, lr=cfg.premise_lr, seed=(cfg.seed, c.cid, rnd), train_A=True,
                       train_B=True, gate_lr=None) for c in clients]
        out = trainer.train_many([c.train for c in clients], [(states[i], {}, mixes[i]) for i in range(n)], kwargs)
        states = [w for w, _ in out]
    Dl = layer_distances(_layer_B(states, trainer.keys, trainer.layers))
    top, sub = world.planted_labels("top"), world.planted_labels("subgroup")
    sil_top = [silhouette(D, top) for D in Dl]
    sil_sub = [silhouette(D, sub) for D in Dl]
    half = len(trainer.layers) // 2
    return {"sil_top": sil_top, "sil_sub": sil_sub,
            "sil_gap": float(np.mean(sil_top[half:]) - np.mean(sil_top[:half])),
            "sil_sub_gap": float(np.mean(sil_sub[half:]) - np.mean(sil_sub[:half]))}


def _arm_outcome(state: dict[str, Any], n: int) -> dict[str, Any]:
    val = float(np.mean([state["val"][c].mean() for c in range(n)]))
    test = np.concatenate([state["test"][c] for c in range(n)])
    client_acc = [float(state["test"][c].mean()) for c in range(n)]
    rounds = len(state["bytes_up"])
    return {"val": val, "items": test, "worst": min(client_acc), "client_acc": client_acc,
            "bytes": float((sum(state["bytes_down"]) + sum(state["bytes_up"])) / max(rounds, 1)),
            "mix": float(np.mean(list(state["mix"].values()))), "log": state.get("log") or {}}


def tune_arm(arm: str, cfg: Config, run_one: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """An arm's constants chosen on its clients' validation accuracy: the learning rate over ``cfg.lr_grid``
    (bracketed, ``cfg.lr_extend`` values past an edge), and for Ditto its lambda over ``cfg.ditto_lams`` (bracketed
    the same way), each lambda with its own learning-rate search.

    Args:
        arm: the arm's name.
        cfg: the run's settings.
        run_one: ``(lr, lam) -> outcome`` with the outcome's mean validation accuracy under ``"val"``.
    Returns:
        (``{"lr": record, "lam": record}`` in ``tune_bracketed``'s form (``"lam"`` for Ditto only), the chosen
        run's outcome).

    Example:
        >>> import dataclasses
        >>> cfg = dataclasses.replace(PRESETS["quick"], lr_grid=(1e-3, 1e-2), lr_extend=1)
        >>> rec, out = tune_arm("local", cfg, lambda lr, lam: {"val": -abs(lr - 1e-2), "lr": lr})
        >>> rec["lr"]["grid"], rec["lr"]["chosen"], rec["lr"]["at_edge"]
        ([0.001, 0.01, 0.1], 0.01, False)
    """
    def by_lr(lam: float | None) -> tuple[dict[str, Any], dict[str, Any]]:
        def score(lr: float) -> tuple[float, dict[str, Any]]:
            out = run_one(lr, lam)
            return out["val"], out
        return tune_bracketed(cfg.lr_grid, score, cfg.lr_extend)

    if arm != "ditto":
        rec, out = by_lr(None)
        return {"lr": rec}, out

    def score_lam(lam: float) -> tuple[float, tuple[dict[str, Any], dict[str, Any]]]:
        rec, out = by_lr(lam)
        return out["val"], (rec, out)

    rec_lam, (rec_lr, out) = tune_bracketed(cfg.ditto_lams, score_lam, cfg.lr_extend)
    return {"lr": rec_lr, "lam": rec_lam}, out


def edge_note(cfg: Config, choices: dict[str, dict[str, Any]]) -> str | None:
    """The headline's note naming every tuned constant still on an edge of its grid (``None`` when none is).

    Example:
        >>> edge_note(PRESETS["quick"], {"local": {"lr": {"chosen": 0.0025, "grid": [0.0025, 0.005, 0.01, 0.02],
        ...                                               "at_edge": True}}})
        'on the edge of its grid after 2 extension(s): local lr 0.0025 of [0.0025, 0.005, 0.01, 0.02]'
    """
    edge = [f"{arm} {name} {rec['chosen']:g} of {[float(f'{v:.3g}') for v in rec['grid']]}"
            for arm, recs in choices.items() for name, rec in recs.items() if rec["at_edge"]]
    if not edge:
        return None
    return f"on the edge of its grid after {cfg.lr_extend} extension(s): " + "; ".join(edge)


def best_baseline(metrics: dict[str, dict[str, float]]) -> str | None:
    """The personalised baseline (of ``BASELINES`` that ran) with the best mean validation accuracy; ties go to
    the first in ``BASELINES``. Never reads a test item.

    Example:
        >>> best_baseline({"local": {"val_accuracy": 0.8}, "ditto": {"val_accuracy": 0.9}, "fedtreelora": {"val_accuracy": 1}})
        'ditto'
    """
    ran = [a for a in BASELINES if a in metrics]
    if not ran:
        return None
    return max(ran, key=lambda a: (metrics[a]["val_accuracy"], -ran.index(a)))


def _rounds(algo: FederatedLoRA, trainer: Any, datas: list[Any], inputs: list[tuple[Any, Any, Any]], lr: float,
            rounds: range, seed: int) -> list[tuple[Any, Any, Any]]:
    """``rounds`` of local training of every client (no sharing), each round ``algo.local_steps`` steps with batch
    seed ``[seed, cid, round]``; the adapters and gates carry over, the external experts stay fixed."""
    for rnd in rounds:
        kwargs = [dict(steps=algo.local_steps, lr=lr, seed=(seed, int(d.cid), rnd), train_A=algo.train_A,
                       train_B=algo.train_B, gate_lr=algo.gate_lr) for d in datas]
        out = trainer.train_many([d.train for d in datas], inputs, kwargs)
        inputs = [(w, ext, mix) for (w, mix), (_, ext, _) in zip(out, inputs, strict=True)]
    return inputs


def tree_start(algo: FederatedLoRA, state: dict[str, Any], warm: dict[str, np.ndarray]
               ) -> tuple[dict[str, Any], list[frozenset]]:
    """A new client's starting message from a trained tree (FedTreeLoRA or flat clustering): ``place_client`` by
    its warm-up adapters ``warm``, then at every layer its block's cluster expert and external expert (what the
    server last sent that block's members).

    Returns:
        (the message, ``clus/<key>`` and ``ext/<key>`` entries, to pass to ``algo.client_inputs``; the block per
        layer).
    """
    B_new = [[warm[k] for k in algo.keys if factor_of(k) == "B" and layer_index(k) == layer] for layer in algo.layers]
    blocks = place_client(B_new, state["log"]["B"], state["log"]["partitions"])
    message: dict[str, Any] = {}
    for layer, block in zip(algo.layers, blocks, strict=True):
        sent = state["messages"][min(block)]          # every member of a block got the same experts
        for k in algo.keys:
            if layer_index(k) == layer:
                message.update({p + k: sent[p + k] for p in (CLUS, EXT) if p + k in sent})
    return message, blocks


def unseen_outcomes(cfg: Config, trainer: Any, world: World, unseen: list[Any], chosen: dict[str, dict[str, Any]]
                    ) -> tuple[dict[str, np.ndarray], dict[str, float]]:
    """Per-item test correctness of the unseen clients (``World.unseen``), personalised from each arm's trained run.

    Every arm spends the same local compute on a new client, ``warmup_rounds + ft_rounds`` rounds of
    ``local_steps`` steps, at the arm's chosen learning rate:

    - ``fedtreelora`` / ``flat_cluster``: the warm-up from the shared initialisation (as in training), then
      ``place_client`` puts the client into the tree by its warm-up B; it starts from its block's cluster expert
      (and external expert and gate) at every layer and fine-tunes for ``ft_rounds``;
    - ``fedavg_ft``: FedAvg's final global adapters (the ``fedavg_lora`` run), fine-tuned for all the rounds;
    - ``local``: the shared initialisation, trained for all the rounds.

    Returns:
        (``{arm: correctness over the unseen clients' test items, client order}``, ``{"unseen_placement": ...}``:
        the mean share of the block's training clients that have the new client's rule, FedTreeLoRA's).
    """
    w, f = cfg.warmup_rounds, ft_rounds(cfg)
    n = len(unseen)
    out: dict[str, np.ndarray] = {}
    diag: dict[str, float] = {}
    for arm in UNSEEN_ARMS:
        src = "fedavg_lora" if arm == "fedavg_ft" else arm
        if arm not in chosen or src not in chosen:
            continue
        algo, state, lr = chosen[src]["algo"], chosen[src]["state"], chosen[arm]["lr"]
        fresh = [algo.client_inputs({}, {}) for _ in range(n)]
        if arm == "local":
            inputs = _rounds(algo, trainer, unseen, fresh, lr, range(1, w + f + 1), cfg.seed)
        elif arm == "fedavg_ft":
            start = [algo.client_inputs(state["messages"][0], {}) for _ in range(n)]
            inputs = _rounds(algo, trainer, unseen, start, lr, range(1, w + f + 1), cfg.seed)
        else:
            warm = _rounds(algo, trainer, unseen, fresh, lr, range(1, w + 1), cfg.seed)
            starts, right = [], []
            for c, (weights, _, _) in enumerate(warm):
                message, blocks = tree_start(algo, state, weights)
                starts.append(algo.client_inputs(message, {}))
                rules = [world.clients[j].subgroup for j in blocks[-1]]
                right.append(float(np.mean([r == unseen[c].spec.subgroup for r in rules])))
            inputs = _rounds(algo, trainer, unseen, starts, lr, range(w + 1, w + f + 1), cfg.seed)
            if arm == "fedtreelora":
                diag["unseen_placement"] = float(np.mean(right))
        out[arm] = np.concatenate(trainer.correct_many([d.test for d in unseen], inputs))
    return out, diag


def trainable_params(arm: str, trainer: Any) -> int:
    """Trainable adapter parameters per client (FFA-LoRA trains B only; gated arms add one gate per module)."""
    if arm == "ffa_lora":
        return trainer.n_parameters(("B",))
    if arm in GATED:
        return trainer.n_parameters(("A", "B", "mix"))
    return trainer.n_parameters(("A", "B"))


def run(cfg: Config) -> SeedRun:
    """One seed: the base, the clients, the premise check, every arm over its lr grid, per-item outcomes."""
    from .client import BatchedLoRATrainer, LoRATrainer

    unknown = set(cfg.arms) - set(ALL_ARMS)
    if unknown:
        raise ValueError(f"unknown arms {sorted(unknown)}; choose from {ALL_ARMS}")
    for name in ("lr_grid", "ditto_lams"):
        grid = getattr(cfg, name)
        if len(grid) < 2 or any(not (v > 0 and math.isfinite(v)) for v in grid) or list(grid) != sorted(set(grid)):
            raise ValueError(f"{name} must hold at least two increasing positive finite values, got {grid}")
    if isinstance(cfg.lr_extend, bool) or not isinstance(cfg.lr_extend, int) or cfg.lr_extend < 0:
        raise ValueError(f"lr_extend must be a non-negative int, got {cfg.lr_extend!r}")
    base, tok = base_model(cfg)
    world = World(twist=cfg.twist)
    clients = make_clients(world, tok, n_train=cfg.n_train, n_val=cfg.n_val, n_test=cfg.n_test, seed=cfg.seed)
    n = world.n_clients
    tkw = dict(labels=LABELS, r=cfg.rank, alpha=cfg.alpha, batch_size=cfg.batch_size)
    trainer = LoRATrainer(copy.deepcopy(base), tok, **tkw)
    batched = BatchedLoRATrainer(base, tok, n, **tkw)

    metrics: dict[str, dict[str, float]] = {}
    items: dict[str, dict[str, list[float]]] = {}
    series: dict[str, Any] = {"cuts": {}, "client_acc": {}}
    notes: dict[str, str] = {}

    # trivial predictors: the frozen base restricted to the label tokens, and each client's majority label
    zero = [trainer.base_correct(c.test) for c in clients]
    items["base_zero_shot"] = {"accuracy": np.concatenate(zero).tolist()}
    metrics["base_zero_shot"] = {"worst_accuracy": float(min(z.mean() for z in zero))}
    maj = [(c.test[1] == int(c.train[1].mean() >= 0.5)).astype(float) for c in clients]
    items["majority"] = {"accuracy": np.concatenate(maj).tolist()}
    metrics["majority"] = {"worst_accuracy": float(min(m.mean() for m in maj))}
    metrics["base"] = {"count_accuracy": count_accuracy(base, tok)}

    # the depth premise, on the pretrained base and on a random one, before any federated run
    premise = premise_check(batched, clients, cfg, world)
    metrics["premise"] = {"sil_gap": premise["sil_gap"], "sil_sub_gap": premise["sil_sub_gap"],
                          **{f"sil_top_l{i}": v for i, v in enumerate(premise["sil_top"])}}
    series["premise"] = premise
    if cfg.random_base_check:
        rand = BatchedLoRATrainer(_fresh_model(cfg, len(tok), seed=cfg.lab_seed + 1), tok, n, **tkw)
        rp = premise_check(rand, clients, cfg, world)
        metrics["random_base"] = {"sil_gap": rp["sil_gap"], "sil_sub_gap": rp["sil_sub_gap"],
                                  **{f"sil_top_l{i}": v for i, v in enumerate(rp["sil_top"])}}
        series["random_premise"] = rp

    top, sub = world.planted_labels("top"), world.planted_labels("subgroup")
    half = len(trainer.layers) // 2
    choices: dict[str, dict[str, Any]] = {}
    chosen: dict[str, Any] = {}
    for arm in progress(cfg.arms, desc="arms"):
        def run_one(lr: float, lam: float | None, arm: str = arm) -> dict[str, Any]:
            algo = make_algorithm(arm, trainer, cfg, lr, world, lam=lam)
            state = run_batched(algo, clients, batched)
            return {**_arm_outcome(state, n), "state": state, "algo": algo, "lr": lr}

        choices[arm], best = tune_arm(arm, cfg, run_one)
        chosen[arm] = best
        items[arm] = {"accuracy": best["items"].tolist()}
        m = {"worst_accuracy": best["worst"], "val_accuracy": best["val"], "lr": best["lr"],
             "lr_at_edge": float(choices[arm]["lr"]["at_edge"]),
             "trainable_params": float(trainable_params(arm, trainer)), "bytes_per_round": best["bytes"]}
        if "lam" in choices[arm]:
            m.update({"lam": choices[arm]["lam"]["chosen"], "lam_at_edge": float(choices[arm]["lam"]["at_edge"])})
        series["client_acc"][arm] = best["client_acc"]
        log = best["log"]
        if log:
            cuts = [int(c) for c in log["cuts"]]
            series["cuts"][arm] = cuts
            m.update({f"clusters_l{i}": float(c) for i, c in enumerate(cuts)})
            m["depth_gap"] = float(np.mean(cuts[half:]) - np.mean(cuts[:half]))
            tree = log["tree"]
            m["tree_ari_top"] = adjusted_rand(top, tree.cut(len(set(top))))
            m["tree_ari_rules"] = adjusted_rand(sub, tree.cut(len(set(sub))))
        if arm in GATED:
            m["mean_gate"] = best["mix"]
        metrics[arm] = m
    note = edge_note(cfg, choices)
    if note:
        notes[HEADLINE] = note

    # the headline's comparator: the personalised baseline that validation (never the test items) ranks first
    pick = best_baseline(metrics)
    if pick is not None:
        items["best_baseline"] = items[pick]
        metrics["best_baseline"] = {"val_accuracy": metrics[pick]["val_accuracy"],
                                    **{f"picked_{a}": float(a == pick) for a in BASELINES if a in metrics}}

    unit_ids = {"items": [i for c in clients for i in c.item_ids("test")]}
    held_out = {"items": {"train": [i for c in clients for i in c.item_ids("train")],
                          "validation": [i for c in clients for i in c.item_ids("val")]}}
    units: dict[str, Any] = {"items": items}
    if cfg.unseen and world.unseen:
        # clients that never trained, personalised from each arm's trained federation (the generalisation claim)
        new = make_clients(world, tok, n_train=cfg.n_train, n_val=cfg.n_val, n_test=cfg.n_test, seed=cfg.seed,
                           specs=world.unseen)
        ut = BatchedLoRATrainer(base, tok, len(new), **tkw)
        correct, diag = unseen_outcomes(cfg, ut, world, new, chosen)
        units["items_unseen"] = {arm: {"accuracy_unseen": v.tolist()} for arm, v in correct.items()}
        units["items_unseen"]["base_zero_shot"] = {
            "accuracy_unseen": np.concatenate([trainer.base_correct(c.test) for c in new]).tolist()}
        if "fedtreelora" in metrics and diag:
            metrics["fedtreelora"].update(diag)
        unit_ids["items_unseen"] = [i for c in new for i in c.item_ids("test")]
        held_out["items_unseen"] = {"train": [i for c in new for i in c.item_ids("train")],
                                    "validation": [i for c in new for i in c.item_ids("val")]}
    return SeedRun(metrics, series=series, notes=notes, units=units, unit_ids=unit_ids, held_out=held_out)


# ------------------------------------------------------------------------------------------------------ plots
def plot(runs: list[SeedRun], result: dict[str, Any], out_dir: Path) -> list[Path]:
    """``<mode>_sharing_depth.png`` (chosen clusters per layer vs the planted levels, and the premise check)
    and ``<mode>_accuracy.png`` (personalised accuracy per arm: mean, worst client, unseen clients)."""
    mode = result["mode"]
    out = []
    fig, (ax, ax2) = new_figure(1, 2)
    for i, r in enumerate(runs):
        cuts = r.series.get("cuts", {}).get("fedtreelora")
        if cuts:
            ax.plot(range(len(cuts)), np.asarray(cuts) + 0.04 * i, "o-", color="C0", alpha=0.7,
                    label="FedTreeLoRA c*_l" if i == 0 else None)
        flat = r.series.get("cuts", {}).get("flat_cluster")
        if flat:
            ax.plot(range(len(flat)), np.asarray(flat) - 0.04 * (i + 1), "s--", color="C1", alpha=0.6,
                    label="flat clustering" if i == 0 else None)
    for level, name in ((1, "all clients"), (2, "planted groups"), (4, "planted rules"), (8, "every client")):
        ax.axhline(level, color="grey", lw=0.6, ls=":")
        ax.text(0.02, level + 0.1, name, fontsize=7, color="grey")
    n_layers = len(next(iter(runs[0].series.get("premise", {}).values()), [])) if runs else 0
    if n_layers:
        ax.set_xticks(range(n_layers))
        ax2.set_xticks(range(n_layers))
    ax.set_xlabel("layer (shallow -> deep)")
    ax.set_ylabel("clusters sharing the layer")
    ax.set_title("sharing depth")
    ax.legend(fontsize=7)
    for key, color, name in (("premise", "C0", "pretrained base"), ("random_premise", "C3", "random base")):
        for i, r in enumerate(runs):
            p = r.series.get(key)
            if p:
                ax2.plot(range(len(p["sil_top"])), p["sil_top"], "o-", color=color, alpha=0.6,
                         label=name if i == 0 else None)
    ax2.axhline(result["config"].get("tau", 0.2), color="grey", ls=":", lw=0.8)
    ax2.set_xlabel("layer")
    ax2.set_ylabel("silhouette of the planted groups")
    ax2.set_title("depth premise (after the warm-up)")
    ax2.legend(fontsize=7)
    out.append(save_figure(fig, Path(out_dir) / f"{mode}_sharing_depth.png"))

    arms = [a for a in result["arms"] if "accuracy" in result["arms"][a]]
    means = [result["arms"][a]["accuracy"]["mean"] for a in arms]
    worst = [result["arms"][a].get("worst_accuracy", {}).get("mean", np.nan) for a in arms]
    unseen = [result["arms"][a].get("accuracy_unseen", {}).get("mean", np.nan) for a in arms]
    fig, ax = new_figure(figsize=(8, 3.6))
    x = np.arange(len(arms))
    ax.bar(x - 0.27, means, 0.27, label="mean over clients")
    ax.bar(x, worst, 0.27, label="worst client")
    ax.bar(x + 0.27, unseen, 0.27, label="unseen clients (mean)")
    ax.set_xticks(x, arms, rotation=40, ha="right", fontsize=7)
    ax.set_ylim(0.4, 1.0)
    ax.set_ylabel("personalised test accuracy")
    ax.legend(fontsize=7)
    out.append(save_figure(fig, Path(out_dir) / f"{mode}_accuracy.png"))
    return out
