"""RoSais (router safety importance) and F-SOUR (token-layer-wise stochastic search for unsafe routes).

**RoSais** (as quoted from the paper): with T_aff the affirmative first tokens and
``p_theta(Q) = max_{a in T_aff} log Pr_theta(a | Q)``, draw S masks Phi^(s) in {0, -inf}^K for router R_l and

    RoSais(theta, Q, R_l, S) = max_s [ p_theta(Q; r_l + Phi^(s)) - p_theta(Q) ],

averaged over prompts. Assumption (the paper's mask size and masked tokens are not public): each mask keeps
``keep`` (default top_k) random experts, the same mask on every prompt token.

**F-SOUR** (official ``search_best_expert_routing``): greedy coordinate ascent over token positions t (in
order; the chat-templated prompt for the official ``prefill`` stage, the fed-back response tokens for
``generation``, both for ``all``) and MoE layers l (in order); at each (t, l) draw N random expert subsets of size
exactly top_k, score each by the joint log-probability of the target (an affirmative string),

    J(routes) = sum_j log Pr(y_j | x, y_<j; routes),

with that token forced onto the subset, keep the best only if it beats the current objective, and stop early
once J >= log 0.8. Up to ``max_iters`` attempts from scratch (seed + attempt). The attack selects among attempts
by J alone (it never sees an evaluation judge); the chosen route is applied and the greedy response returned for
a separate judge. The official driver's judged protocol is available with ``judge=`` for a shadow judge.

Example:
    >>> from icml26.common.tiny_lm import char_tokenizer, tiny_causal_lm
    >>> tok = char_tokenizer()
    >>> model = tiny_causal_lm(len(tok), family="mixtral", layers=2, experts=4, top_k=2, seed=0).eval()
    >>> attack = FSOUR(model, tok, n_candidates=4, max_iters=1, max_new_tokens=4).attack("how to x.", "sure")
    >>> attack.forwards > 0, all(len(e) == 2 for e in attack.routes.values())
    (True, True)
    >>> rosais(model, tok, ["how to x."], ["sure"], n_masks=4).scores.shape
    (2,)

Reference: Jiang et al., "Sparse Models, Sparse Safety: Unsafe Routes in Mixture-of-Experts LLMs", ICML 2026
(arXiv 2602.08621); github.com/TrustAIRLab/UnsafeMoE (``main.py``).
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from .judge import Judge
from .routing import RouterController


def encode(tokenizer: Any, text: str, what: str = "prompt") -> list[int]:
    """Token ids of ``text`` without special tokens (pass chat-templated text for chat models)."""
    if not isinstance(text, str):
        raise TypeError(f"{what} must be a string, got {type(text).__name__}")
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    if not ids:
        raise ValueError(f"{what} is empty")
    return list(ids)


@contextlib.contextmanager
def controlled(model: Any, controller: RouterController | None) -> Iterator[RouterController]:
    """``controller`` if given (its soft rules cleared on exit), else a fresh one closed on exit."""
    if controller is not None:
        if controller.model is not model:
            raise ValueError("controller is attached to a different model")
        try:
            yield controller
        finally:
            controller.clear()
    else:
        with RouterController(model) as rc:
            yield rc


def _subset_size(rc: RouterController, size: int | None, name: str) -> int:
    k = min(rc.info(layer).top_k for layer in rc.layers) if size is None else size
    n = min(rc.info(layer).num_experts for layer in rc.layers)
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= n:
        raise ValueError(f"{name} must be an int in [1, {n}] (the number of experts), got {size!r}")
    return k


def random_subsets(rng: np.random.Generator, n: int, num_experts: int, size: int) -> torch.Tensor:
    """``(n, size)`` expert ids, each row a uniformly random subset of ``range(num_experts)``."""
    return torch.from_numpy(np.argsort(rng.random((n, num_experts)), axis=1)[:, :size].copy()).long()


def _phi(subsets: torch.Tensor, num_experts: int) -> torch.Tensor:
    """Keep-masks to Phi: True (= -inf) for experts outside each row's subset; shape ``(*subsets.shape[:-1], K)``."""
    keep = torch.zeros(*subsets.shape[:-1], num_experts, dtype=torch.bool).scatter_(-1, subsets, True)
    return ~keep


@torch.no_grad()
def target_logprob(
    model: Any, prompt_ids: Sequence[int], target_ids: Sequence[int], rows: int = 1
) -> torch.Tensor:
    """``log Pr(target | prompt)`` summed over target tokens, for ``rows`` copies (one per routing candidate)."""
    ids = torch.tensor([list(prompt_ids) + list(target_ids)]).expand(rows, -1)
    logits = model(input_ids=ids).logits[:, len(prompt_ids) - 1 : -1].float()
    lp = torch.log_softmax(logits, dim=-1).gather(-1, ids[:, len(prompt_ids) :, None]).squeeze(-1)
    out = lp.sum(-1)
    if not torch.isfinite(out).all():
        raise FloatingPointError("non-finite target log-probability (a routing rule broke the model?)")
    return out


@torch.no_grad()
def greedy(
    model: Any, tokenizer: Any, prompt_ids: Sequence[int], max_new_tokens: int, *, use_cache: bool = True
) -> str:
    """The greedy continuation of ``prompt_ids``. Positional routing rules on the controller apply to calls that
    run more than one position: the prefill, or every step with ``use_cache=False``."""
    ids = torch.tensor([list(prompt_ids)])
    out = model.generate(
        input_ids=ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=max_new_tokens,
        do_sample=False,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        use_cache=use_cache,
    )
    return tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True)


# ------------------------------------------------------------------------------------------------------ RoSais
@dataclass
class RoSaisResult:
    """RoSais per router.

    Attributes:
        layers: the router layers, in order.
        scores: ``(n_layers,)`` RoSais (mean over prompts of the best mask's gain in affirmative log-prob).
        gains: ``(n_layers, n_prompts, n_masks)`` every mask's gain.
        masks: ``{layer: (n_masks, keep) kept experts}``.
        base: ``(n_prompts,)`` p_theta(Q) without masks.
    """

    layers: list[int]
    scores: np.ndarray
    gains: np.ndarray
    masks: dict[int, torch.Tensor]
    base: np.ndarray

    def ranked(self) -> list[int]:
        """Layers from the most to the least safety-critical."""
        return [self.layers[i] for i in np.argsort(-self.scores, kind="stable")]

    def best_mask(self, layer: int) -> list[int]:
        """The kept experts of the mask with the largest mean gain over prompts at ``layer``."""
        i = self.layers.index(layer)
        return sorted(self.masks[layer][int(np.argmax(self.gains[i].mean(axis=0)))].tolist())


@torch.no_grad()
def rosais(
    model: Any,
    tokenizer: Any,
    prompts: Sequence[str],
    affirmative: Sequence[str] = ("Sure",),
    *,
    n_masks: int = 16,
    keep: int | None = None,
    seed: int = 0,
    controller: RouterController | None = None,
) -> RoSaisResult:
    """Router Safety importance score of every MoE router.

    Args:
        model: a MoE causal LM.
        tokenizer: its tokenizer.
        prompts: harmful prompts (chat-templated text for chat models).
        affirmative: affirmative openings; their first tokens form T_aff.
        n_masks: S, random masks per router.
        keep: experts each mask keeps (default top_k).
        seed: seed of the masks.
        controller: an attached :class:`RouterController` (e.g. carrying a defence); default a fresh one.

    Returns:
        a :class:`RoSaisResult`.
    """
    if isinstance(prompts, str) or not prompts:
        raise ValueError("prompts must be a non-empty list of strings")
    if isinstance(affirmative, str) or not affirmative:
        raise ValueError("affirmative must be a non-empty list of strings")
    if n_masks < 1:
        raise ValueError(f"n_masks must be >= 1, got {n_masks}")
    aff = sorted({encode(tokenizer, a, "affirmative string")[0] for a in affirmative})
    encoded = [encode(tokenizer, p) for p in prompts]
    rng = np.random.default_rng(seed)

    def p_theta(ids: list[int], rows: int) -> np.ndarray:
        logits = model(input_ids=torch.tensor([ids]).expand(rows, -1)).logits[:, -1].float()
        # p_theta(Q) = max_{a in T_aff} log Pr(a | Q)
        return torch.log_softmax(logits, -1)[:, aff].max(-1).values.numpy().astype(np.float64)

    with controlled(model, controller) as rc:
        keep_k = _subset_size(rc, keep, "keep")
        base = np.array([p_theta(ids, 1)[0] for ids in encoded])
        gains = np.zeros((len(rc.layers), len(prompts), n_masks))
        masks = {}
        for i, layer in enumerate(rc.layers):
            kept = random_subsets(rng, n_masks, rc.info(layer).num_experts, keep_k)
            masks[layer] = kept
            for q, ids in enumerate(encoded):
                # r' = r_l + Phi^(s): the same mask on every prompt token
                rc.set_phi(layer, _phi(kept, rc.info(layer).num_experts)[:, None, :].expand(-1, len(ids), -1))
                gains[i, q] = p_theta(ids, n_masks) - base[q]
                rc.clear()
    # RoSais = max_s [p^(s) - p], averaged over prompts
    return RoSaisResult(rc.layers, gains.max(axis=2).mean(axis=1), gains, masks, base)


# ------------------------------------------------------------------------------------------------------ F-SOUR
STAGES = ("prefill", "generation", "all")


def chat_text(tokenizer: Any, prompt: str, chat_template: bool | None = None) -> str:
    """The text the model sees for a user ``prompt``.

    With ``chat_template`` True (or None and the tokenizer has one) the prompt goes through
    ``tokenizer.apply_chat_template`` as one user turn with the generation prompt, as the official code builds its
    prefill; otherwise it is used as is.
    """
    if not isinstance(prompt, str):
        raise TypeError(f"prompt must be a string, got {type(prompt).__name__}")
    has = getattr(tokenizer, "chat_template", None) is not None
    if chat_template is None:
        chat_template = has
    if not chat_template:
        return prompt
    if not has:
        raise ValueError("chat_template=True but the tokenizer has no chat template")
    return tokenizer.apply_chat_template(
        [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=False
    )


def stage_positions(stage: str, n_prompt: int, n_target: int) -> list[int]:
    """Token positions whose routes a search may force.

    ``"prefill"``: the prompt tokens ``0..P-1`` (the official search); ``"generation"``: the target tokens fed
    back while decoding, ``P..P+T-2`` (the last target token never conditions the target); ``"all"``: both.
    """
    if stage == "prefill":
        return list(range(n_prompt))
    if stage == "generation":
        return list(range(n_prompt, n_prompt + n_target - 1))
    if stage == "all":
        return list(range(n_prompt + n_target - 1))
    raise ValueError(f"stage must be one of {STAGES}, got {stage!r}")


@dataclass
class RouteAttack:
    """The outcome of a route attack on one prompt.

    Attributes:
        routes: ``{(position, layer): experts}`` forced (positions index the model's input: the chat-templated
            prompt, then the response).
        logprob: log Pr(target | prompt) under the routes (the search's own objective).
        output: the greedy response under the routes.
        score: the attack's judge's score of ``output`` (NaN when the attack ran without a judge).
        success: with a judge, ``score >= success_score``; without, ``logprob >= threshold`` (the objective
            reached its target). Never an evaluation verdict: judge the output separately.
        forwards: sequences scored during the search (a batch of N counts N).
        attempts: search attempts made.
        seconds: wall time of the attack.
        prompt_ids: the token ids the routes' positions refer to (the templated prompt).
        trace: the best-so-far route against compute, ``[(forwards, log Pr(target), routes), ...]``: an entry each
            time the attack's best objective rose (the first is the unrouted prompt after 1 forward). The state
            after ``b`` forwards is the last entry with ``forwards <= b`` (:func:`best_within`). Without a judge
            the last entry is the attack's result.
    """

    routes: dict[tuple[int, int], tuple[int, ...]]
    logprob: float
    output: str
    score: float
    success: bool
    forwards: int
    attempts: int
    seconds: float
    history: list[float] = field(default_factory=list, repr=False)
    prompt_ids: tuple[int, ...] = ()
    trace: list[tuple[int, float, dict[tuple[int, int], tuple[int, ...]]]] = field(default_factory=list, repr=False)


def best_within(
    attack: RouteAttack, budget: int
) -> tuple[int, float, dict[tuple[int, int], tuple[int, ...]]]:
    """The attack's best-so-far ``(forwards, log Pr(target), routes)`` after at most ``budget`` scored sequences
    (from :attr:`RouteAttack.trace`): what the attack would have returned had it been stopped there."""
    if not attack.trace:
        raise ValueError("the attack has no trace (judged attacks do not record one)")
    if isinstance(budget, bool) or not isinstance(budget, int) or budget < 1:
        raise ValueError(f"budget must be a positive int, got {budget!r}")
    state = attack.trace[0]
    for entry in attack.trace:
        if entry[0] > budget:
            break
        state = entry
    return state


def routes_to_phi(
    rc: RouterController, routes: dict[tuple[int, int], Sequence[int]], length: int
) -> dict[int, torch.Tensor]:
    """``{layer: Phi (length, K)}`` forcing each ``(position, layer)`` onto its experts."""
    phi = {layer: torch.zeros(length, rc.info(layer).num_experts, dtype=torch.bool) for layer in rc.layers}
    for (t, layer), experts in routes.items():
        if not 0 <= t < length:
            raise ValueError(f"route position {t} outside the {length} positions")
        phi[layer][t] = _phi(torch.tensor(list(experts)), rc.info(layer).num_experts)
    return phi


def apply_routes(rc: RouterController, routes: dict[tuple[int, int], Sequence[int]], length: int) -> None:
    """Put ``routes`` on the controller as soft rules over the first ``length`` positions."""
    for layer, phi in routes_to_phi(rc, routes, length).items():
        if phi.any():
            rc.set_phi(layer, phi)


def routed_response(
    model: Any,
    tokenizer: Any,
    rc: RouterController,
    routes: dict[tuple[int, int], Sequence[int]],
    p_ids: Sequence[int],
    max_new_tokens: int,
) -> str:
    """The greedy response with ``routes`` forced. Routes on response positions need every decoding step to run
    the whole sequence (no KV cache), so that the positional rules reach them."""
    length = max([t + 1 for t, _ in routes] + [len(p_ids)])
    apply_routes(rc, routes, length)
    try:
        return greedy(model, tokenizer, p_ids, max_new_tokens, use_cache=length <= len(p_ids))
    finally:
        rc.clear()


class FSOUR:
    """F-SOUR: fine-grained token-layer-wise stochastic optimisation of unsafe routes.

    Objective: ``log Pr(target | prompt; routes) = sum_j log Pr(y_j | prompt, y_<j; routes)``, raised by greedy
    coordinate ascent over (position, layer) with N random top_k-subsets per coordinate; stop at ``threshold``.

    By default the attack never consults a judge: each attempt stops on its own objective, attempts stop once one
    reaches ``threshold``, and the attempt with the highest objective is applied and its greedy response returned
    (evaluate that response with any judge afterwards). With ``judge`` given, the official driver's protocol runs
    instead (default response judged first, every attempt's response judged, the best-judged kept): use it only
    with a judge separate from the one that evaluates the attack.

    Args:
        model: a MoE causal LM (``transformers``; see :class:`~icml26.unsafe_moe.routing.RouterController`).
        tokenizer: its tokenizer.
        n_candidates: N, random expert subsets tried per (token, layer) (official run: 100).
        max_iters: search attempts from scratch (official: 5).
        threshold: early stop when log Pr(target) >= threshold (official: log 0.8).
        stage: positions searched: ``"prefill"`` (official), ``"generation"`` or ``"all"`` (:func:`stage_positions`).
        chat_template: format prompts with the tokenizer's chat template (None: when it has one).
        subset_size: experts per candidate subset (default the router's top_k, as in the official code).
        judge: optional shadow judge for the official protocol (see above); default None.
        success_score: with a judge, a response with score >= this is a success (official: 1.0).
        max_new_tokens: response length.
        seed: base seed; attempt i uses ``seed + i``.
        controller: an attached controller (e.g. one carrying a defence's hard bans); default a fresh one.

    Example:
        >>> from icml26.common.tiny_lm import char_tokenizer, tiny_causal_lm
        >>> tok = char_tokenizer()
        >>> model = tiny_causal_lm(len(tok), family="olmoe", layers=2, experts=4, top_k=2, seed=0).eval()
        >>> a = FSOUR(model, tok, n_candidates=4, max_iters=1, max_new_tokens=4, stage="all").attack("x.", "sure")
        >>> a.forwards > 1, a.logprob >= a.history[0]
        (True, True)
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        n_candidates: int = 100,
        max_iters: int = 5,
        threshold: float = math.log(0.8),
        stage: str = "prefill",
        chat_template: bool | None = None,
        subset_size: int | None = None,
        judge: Judge | None = None,
        success_score: float = 1.0,
        max_new_tokens: int = 64,
        seed: int = 0,
        controller: RouterController | None = None,
    ):
        if n_candidates < 1 or max_iters < 1 or max_new_tokens < 1:
            raise ValueError("n_candidates, max_iters and max_new_tokens must be >= 1")
        if not math.isfinite(threshold) or threshold > 0:
            raise ValueError(f"threshold is a log-probability and must be finite and <= 0, got {threshold}")
        if stage not in STAGES:
            raise ValueError(f"stage must be one of {STAGES}, got {stage!r}")
        if judge is not None and not callable(judge):
            raise TypeError("judge must be a callable (prompt, response) -> score, or None")
        self.model, self.tokenizer = model, tokenizer
        self.n_candidates, self.max_iters, self.threshold = n_candidates, max_iters, threshold
        self.stage, self.chat_template = stage, chat_template
        self.subset_size, self.judge, self.success_score = subset_size, judge, success_score
        self.max_new_tokens, self.seed, self.controller = max_new_tokens, seed, controller
        with controlled(model, controller) as rc:
            _subset_size(rc, subset_size, "subset_size")

    def encode(self, prompt: str, target: str) -> tuple[list[int], list[int]]:
        """Token ids of the (chat-templated) prompt and of the target."""
        return (
            encode(self.tokenizer, chat_text(self.tokenizer, prompt, self.chat_template)),
            encode(self.tokenizer, target, "target"),
        )

    def search(
        self,
        prompt: str,
        target: str,
        *,
        seed: int = 0,
        controller: RouterController | None = None,
        on_step: Any = None,
    ) -> tuple[dict[tuple[int, int], tuple[int, ...]], float, int, list[float]]:
        """One attempt: ``(routes, log Pr(target), forwards, objective after each coordinate)``.

        ``on_step(forwards, objective, routes)`` is called whenever the attempt's objective rises (forwards counted
        from the attempt's start)."""
        p_ids, t_ids = self.encode(prompt, target)
        rng = np.random.default_rng(seed)
        length = len(p_ids) + len(t_ids)
        with controlled(self.model, controller or self.controller) as rc:
            k = _subset_size(rc, self.subset_size, "subset_size")
            routes: dict[tuple[int, int], tuple[int, ...]] = {}
            best = float(target_logprob(self.model, p_ids, t_ids)[0])
            forwards, history = 1, [best]
            for t in stage_positions(self.stage, len(p_ids), len(t_ids)):
                for layer in rc.layers:
                    if best >= self.threshold:
                        return routes, best, forwards, history
                    num_experts = rc.info(layer).num_experts
                    cands = random_subsets(rng, self.n_candidates, num_experts, k)
                    phi = routes_to_phi(rc, routes, length)
                    rc.clear()
                    for other, m in phi.items():
                        if other == layer:
                            m = m[None].repeat(self.n_candidates, 1, 1)
                            m[:, t] = _phi(cands, num_experts)
                        if m.any():
                            rc.set_phi(other, m)
                    lp = target_logprob(self.model, p_ids, t_ids, rows=self.n_candidates)
                    rc.clear()
                    forwards += self.n_candidates
                    i = int(torch.argmax(lp))
                    # keep the best candidate only if it improves the objective (greedy coordinate ascent)
                    if float(lp[i]) > best:
                        best = float(lp[i])
                        routes[(t, layer)] = tuple(sorted(cands[i].tolist()))
                        if on_step is not None:
                            on_step(forwards, best, routes)
                    history.append(best)
            return routes, best, forwards, history

    def attack(self, prompt: str, target: str) -> RouteAttack:
        """Search up to ``max_iters`` attempts and return the best one's routes and greedy response.

        Without a judge: stop once an attempt's objective reaches ``threshold`` and keep the highest objective.
        With a judge: the official protocol (see the class docstring).
        """
        start = time.perf_counter()
        p_ids, t_ids = self.encode(prompt, target)
        with controlled(self.model, self.controller) as rc:
            base = float(target_logprob(self.model, p_ids, t_ids)[0])
            best = RouteAttack(
                {}, base, "", math.nan, base >= self.threshold, 1, 0, 0.0, [base], tuple(p_ids)
            )
            forwards = 1
            if self.judge is None:
                trace: list[tuple[int, float, dict[tuple[int, int], tuple[int, ...]]]] = [(1, base, {})]

                def record(used: int, lp: float, routes: dict[tuple[int, int], tuple[int, ...]]) -> None:
                    # the best-so-far over attempts rises: note it with the forwards spent to reach it
                    if lp > trace[-1][1]:
                        trace.append((forwards + used, lp, dict(routes)))

                for attempt in range(self.max_iters):
                    if best.logprob >= self.threshold:
                        break
                    routes, lp, used, history = self.search(
                        prompt, target, seed=self.seed + attempt, controller=rc, on_step=record
                    )
                    forwards += used
                    if lp > best.logprob:
                        best = RouteAttack(
                            routes, lp, "", math.nan, lp >= self.threshold, 0, 0, 0.0, history, tuple(p_ids)
                        )
                    best.attempts = attempt + 1
                best.trace = trace
                best.output = routed_response(
                    self.model, self.tokenizer, rc, best.routes, p_ids, self.max_new_tokens
                )
            else:
                best.output = routed_response(self.model, self.tokenizer, rc, {}, p_ids, self.max_new_tokens)
                best.score = float(self.judge(prompt, best.output))
                best.success = best.score >= self.success_score
                for attempt in range(self.max_iters):
                    if best.success:
                        break
                    routes, lp, used, history = self.search(
                        prompt, target, seed=self.seed + attempt, controller=rc
                    )
                    forwards += used
                    output = routed_response(self.model, self.tokenizer, rc, routes, p_ids, self.max_new_tokens)
                    score = float(self.judge(prompt, output))
                    if (score, lp) > (best.score, best.logprob):
                        best = RouteAttack(
                            routes,
                            lp,
                            output,
                            score,
                            score >= self.success_score,
                            0,
                            0,
                            0.0,
                            history,
                            tuple(p_ids),
                        )
                    best.attempts = attempt + 1
        best.forwards, best.seconds = forwards, time.perf_counter() - start
        return best


def random_route_search(
    model: Any,
    tokenizer: Any,
    prompt: str,
    target: str,
    *,
    n_routes: int,
    budget: int,
    stage: str = "prefill",
    chat_template: bool | None = None,
    threshold: float = math.log(0.8),
    subset_size: int | None = None,
    max_new_tokens: int = 64,
    seed: int = 0,
    batch: int = 64,
    controller: RouterController | None = None,
) -> RouteAttack:
    """The controls: ``budget`` random route perturbations, each forcing ``n_routes`` random (position, layer)
    pairs (positions of ``stage``) onto random expert subsets; the one with the highest log Pr(target) (F-SOUR's
    objective, never a judge) is applied and its greedy response returned.

    ``budget=1`` is a random route of that size with no selection; ``budget`` = F-SOUR's forward passes is a
    random search with F-SOUR's compute and selection rule. ``success`` is ``logprob >= threshold``.
    """
    if n_routes < 0 or budget < 1 or batch < 1:
        raise ValueError("n_routes must be >= 0, budget and batch >= 1")
    if stage not in STAGES:
        raise ValueError(f"stage must be one of {STAGES}, got {stage!r}")
    start = time.perf_counter()
    p_ids = encode(tokenizer, chat_text(tokenizer, prompt, chat_template))
    t_ids = encode(tokenizer, target, "target")
    positions = stage_positions(stage, len(p_ids), len(t_ids))
    rng = np.random.default_rng(seed)
    with controlled(model, controller) as rc:
        k = _subset_size(rc, subset_size, "subset_size")
        num_experts = {rc.info(layer).num_experts for layer in rc.layers}
        if len(num_experts) != 1:
            raise ValueError("random_route_search needs the same number of experts in every layer")
        n_exp, n_layers, length = num_experts.pop(), len(rc.layers), len(p_ids) + len(t_ids)
        n_slots = len(positions) * n_layers  # slot = position ordinal * n_layers + layer ordinal
        n_routes = min(n_routes, n_slots)
        best_routes: dict[tuple[int, int], tuple[int, ...]] = {}
        best_lp, done = -math.inf, 0
        trace: list[tuple[int, float, dict[tuple[int, int], tuple[int, ...]]]] = []
        pos = torch.tensor(positions, dtype=torch.long)
        while done < budget:
            rows = min(batch, budget - done)
            slots = torch.from_numpy(np.argsort(rng.random((rows, n_slots)), axis=1)[:, :n_routes].copy())
            subsets = torch.from_numpy(
                np.argsort(rng.random((rows, n_routes, n_exp)), axis=2)[..., :k].copy()
            )
            flat = torch.zeros(rows, n_slots, n_exp, dtype=torch.bool)
            flat[torch.arange(rows)[:, None], slots] = _phi(subsets, n_exp)
            flat = flat.reshape(rows, len(positions), n_layers, n_exp)
            for i, layer in enumerate(rc.layers):
                if flat[:, :, i].any():
                    phi = torch.zeros(rows, length, n_exp, dtype=torch.bool)
                    phi[:, pos] = flat[:, :, i]
                    rc.set_phi(layer, phi)
            lp = target_logprob(model, p_ids, t_ids, rows=rows)
            rc.clear()
            # every row that beats all before it is a rise of the best-so-far, reached after done + i + 1 forwards
            for i in range(rows):
                if float(lp[i]) > best_lp:
                    best_lp = float(lp[i])
                    best_routes = {
                        (positions[int(s) // n_layers], rc.layers[int(s) % n_layers]): tuple(sorted(e.tolist()))
                        for s, e in zip(slots[i], subsets[i], strict=True)
                    }
                    trace.append((done + i + 1, best_lp, best_routes))
            done += rows
        output = routed_response(model, tokenizer, rc, best_routes, p_ids, max_new_tokens)
    return RouteAttack(
        best_routes,
        best_lp,
        output,
        math.nan,
        best_lp >= threshold,
        budget,
        1,
        time.perf_counter() - start,
        [best_lp],
        tuple(p_ids),
        trace,
    )


@torch.no_grad()
def route_disabling_bans(
    model: Any,
    tokenizer: Any,
    attacks: Sequence[tuple[str, RouteAttack]],
    *,
    per_layer: int = 1,
    controller: RouterController | None = None,
) -> dict[int, list[int]]:
    """Safety-aware route disabling: per layer, the ``per_layer`` experts most over-used by unsafe routes.

    For every successful attack (without a judge: one whose objective reached its threshold), each forced
    (token, layer) route counts +1 for its experts and -1 for the experts the default router chose at that
    token; the experts with the largest positive excess are banned.

    Args:
        attacks: ``(prompt, RouteAttack)`` pairs found on calibration prompts.
        per_layer: experts banned per layer (at most K - top_k).

    Returns:
        ``{layer: [expert, ...]}`` for :func:`~icml26.unsafe_moe.routing.disable_routes`.
    """
    with controlled(model, controller) as rc:
        excess = {layer: np.zeros(rc.info(layer).num_experts) for layer in rc.layers}
        for prompt, attack in attacks:
            if not attack.success or not attack.routes:
                continue
            ids = list(attack.prompt_ids) or encode(tokenizer, prompt)
            model(input_ids=torch.tensor([ids]))
            default = rc.routes()
            for (t, layer), experts in attack.routes.items():
                if t >= len(ids):  # a response position: no default route to compare with
                    continue
                excess[layer][list(experts)] += 1
                excess[layer][default[layer][0, t].tolist()] -= 1
        bans = {}
        for layer, e in excess.items():
            limit = rc.info(layer).num_experts - rc.info(layer).top_k
            if not 0 <= per_layer <= limit:
                raise ValueError(f"per_layer must be in [0, {limit}] (K - top_k), got {per_layer}")
            order = [int(i) for i in np.argsort(-e, kind="stable") if e[i] > 0]
            bans[layer] = sorted(order[:per_layer])
    return bans
