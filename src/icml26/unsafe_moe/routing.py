"""Route control for ``transformers`` mixture-of-experts models: force, mask and record expert routes.

In transformers 5 every MoE block calls a router module (``MixtralTopKRouter``, ``Qwen2MoeTopKRouter``,
``OlmoeTopKRouter``, ``Qwen3MoeTopKRouter``, ...) that returns ``(router_logits, routing_weights,
expert_indices)`` computed as

    p = softmax(r),   (w, idx) = top-k(p),   w <- w / sum(w)   (renormalisation: always for Mixtral,
                                                                 per ``norm_topk_prob`` elsewhere)

with ``r = W h`` the router logits of a token. :class:`RouterController` puts a forward hook on each router that
adds a mask Phi in {0, -inf}^K to the logits and redoes the same rule,

    r' = r + Phi,   p' = softmax(r'),   (w', idx') = top-k(p')   (-> renormalised as the router does),

so forcing token t at layer l onto an expert set S sets Phi_e = -inf for every e not in S (the official UnsafeMoE
patch, rewritten for the router contract of transformers 5). The router's rule is checked when the controller
attaches: a router whose outputs this recomputation does not reproduce (e.g. group-limited routing with a score
correction bias, DeepSeek-V3 style) is refused with a ``TypeError`` naming its class rather than silently routed
differently. Shared experts (Qwen2-MoE) are outside routing: they always run and cannot be forced or masked.

Rules are *soft* (an attack's routes; removed by :meth:`RouterController.clear`) or *hard* (a serving-side
defence such as :func:`disable_routes`; they win when the two conflict). Rules with positions apply only to
prefill calls (sequence length > 1), as in the official code; rules without positions apply to every token.

Example:
    >>> from icml26.common.tiny_lm import tiny_causal_lm
    >>> import torch
    >>> model = tiny_causal_lm(50, family="mixtral", layers=2, experts=4, top_k=2, seed=0).eval()
    >>> ids = torch.tensor([[5, 6, 7, 8]])
    >>> with RouterController(model) as rc:
    ...     rc.force(layer=1, position=0, experts=[2, 3])
    ...     _ = model(ids)
    ...     sorted(rc.routes()[1][0, 0].tolist())
    [2, 3]

Reference: Jiang et al., "Sparse Models, Sparse Safety: Unsafe Routes in Mixture-of-Experts LLMs", ICML 2026
(arXiv 2602.08621); official code github.com/TrustAIRLab/UnsafeMoE (``control_router.py``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

_ROUTER_CLASS = re.compile(r"Top[kK]Router$")
_LAYER_INDEX = re.compile(r"(?:^|\.)layers?\.(\d+)\.")
_ATTACHED = "_icml26_router_controller"


@dataclass(frozen=True)
class RouterInfo:
    """One router of a MoE model.

    Attributes:
        layer: the decoder layer index (parsed from the module path; the ordinal if the path has none).
        name: the module path, e.g. ``model.layers.3.mlp.gate``.
        module: the router module.
        num_experts: routed experts K.
        top_k: experts chosen per token.
        renormalize: whether the chosen weights are renormalised to sum to 1.
        shared_expert: whether the block also runs a shared expert that routing cannot switch off.
    """

    layer: int
    name: str
    module: nn.Module = field(repr=False)
    num_experts: int
    top_k: int
    renormalize: bool
    shared_expert: bool


def route(
    logits: torch.Tensor, top_k: int, renormalize: bool, mask: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """The router rule on (masked) logits: ``softmax(r + Phi) -> top-k (-> renormalise)``.

    Args:
        logits: ``(N, K)`` router logits r.
        top_k: experts per token.
        renormalize: renormalise the chosen weights to sum to 1.
        mask: optional ``(N, K)`` bool, True where Phi = -inf.

    Returns:
        ``(weights, indices)``, each ``(N, top_k)``; weights in the logits' dtype.
    """
    r = logits.float()
    if mask is not None:
        # r' = r + Phi, Phi in {0, -inf}^K
        r = r.masked_fill(mask, float("-inf"))
    probs = torch.softmax(r, dim=-1)
    top, idx = torch.topk(probs, top_k, dim=-1)
    if renormalize:
        top = top / top.sum(dim=-1, keepdim=True)
    return top.to(logits.dtype), idx


def find_routers(model: nn.Module) -> list[RouterInfo]:
    """The routers of ``model`` in layer order, each checked against :func:`route`.

    Raises:
        TypeError: ``model`` is not a ``torch.nn.Module``, has no top-k router (a dense model), or has a router
            whose outputs :func:`route` does not reproduce.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    modules = dict(model.named_modules())
    found = [(n, m) for n, m in modules.items() if _ROUTER_CLASS.search(type(m).__name__)]
    if not found:
        raise TypeError(
            f"{type(model).__name__} has no mixture-of-experts router (no *TopKRouter module): routes "
            "can only be controlled on MoE models such as Mixtral, Qwen2-MoE, Qwen3-MoE or OLMoE"
        )
    infos = []
    for ordinal, (name, module) in enumerate(found):
        m = _LAYER_INDEX.search(name)
        parent = modules.get(name.rpartition(".")[0])
        shared = parent is not None and any(hasattr(parent, a) for a in ("shared_expert", "shared_experts"))
        num_experts, top_k = _router_sizes(module)
        infos.append(
            RouterInfo(
                layer=int(m.group(1)) if m else ordinal,
                name=name,
                module=module,
                num_experts=num_experts,
                top_k=top_k,
                renormalize=_router_rule(module, top_k),
                shared_expert=shared,
            )
        )
    if len({i.layer for i in infos}) != len(infos):
        infos = [
            RouterInfo(o, i.name, i.module, i.num_experts, i.top_k, i.renormalize, i.shared_expert)
            for o, i in enumerate(infos)
        ]
    return infos


def _router_sizes(module: nn.Module) -> tuple[int, int]:
    weight = getattr(module, "weight", None)
    top_k = getattr(module, "top_k", None)
    if not isinstance(weight, torch.Tensor) or weight.ndim != 2 or not isinstance(top_k, int):
        raise TypeError(
            f"{type(module).__name__} is not a linear top-k router (needs .weight (K, H) and .top_k); "
            "its routes cannot be controlled"
        )
    return int(weight.shape[0]), top_k


@torch.no_grad()
def _router_rule(module: nn.Module, top_k: int) -> bool:
    """Whether ``module`` renormalises its top-k weights, found by running it on random hidden states."""
    weight = module.weight
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        h = torch.randn(16, weight.shape[1], dtype=weight.dtype, device=weight.device)
    # the rule in eval mode: a model in training may add router noise (Mixtral's jitter) or carry a RouteDropout
    was_training = module.training
    module.eval()
    try:
        out = module(h)
    finally:
        module.train(was_training)
    if not (isinstance(out, tuple) and len(out) == 3):
        raise TypeError(
            f"{type(module).__name__} does not return (router_logits, weights, indices); its routes "
            "cannot be controlled with this version of the hook"
        )
    logits, weights, indices = out
    for renormalize in (True, False):
        w, idx = route(logits, top_k, renormalize)
        if torch.equal(idx.sort(-1).values, indices.sort(-1).values) and torch.allclose(
            w.float().sort(-1).values, weights.float().sort(-1).values, atol=1e-5, rtol=1e-4
        ):
            return renormalize
    raise TypeError(
        f"{type(module).__name__} routes by a rule other than softmax -> top-k (-> renormalise) "
        "(e.g. grouped routing or a score-correction bias); forcing its routes would change more than "
        "the chosen experts, so it is not supported"
    )


@dataclass
class _Rule:
    keep: bool  # True: only `experts` allowed; False: `experts` removed
    experts: torch.Tensor | None  # (n,) or (B, n) long; None for a dense Phi
    positions: (
        tuple[int, ...] | str | None
    )  # tuple: those prefill positions; "prefill": all; None: every call
    hard: bool
    phi: torch.Tensor | None = None  # (B or 1, T, K) bool, True = -inf, on prefill positions 0..T-1
    spare_default: bool = False  # never mask an expert the unmodified router chose for that token


class RouterController:
    """Hooks on every router of a MoE model that force, mask and record expert routes.

    Args:
        model: a ``transformers`` MoE causal LM (or any module holding ``*TopKRouter`` routers).

    Use as a context manager (hooks removed on exit) or call :meth:`close`. One controller per model at a time.

    Raises:
        TypeError: a dense model, an unsupported router (see :func:`find_routers`).
        RuntimeError: another controller is attached to ``model``.
    """

    def __init__(self, model: nn.Module):
        self.routers = find_routers(model)
        if getattr(model, _ATTACHED, None) is not None:
            raise RuntimeError(
                "another RouterController is attached to this model; close it first (or pass it "
                "as controller=)"
            )
        self.model = model
        self._by_layer = {r.layer: r for r in self.routers}
        self._rules: dict[int, list[_Rule]] = {r.layer: [] for r in self.routers}
        self._shape: dict[int, tuple[int, int]] = {}
        self._routes: dict[int, torch.Tensor] = {}
        self._handles: list[Any] = []
        modules = dict(model.named_modules())
        for r in self.routers:
            parent = modules[r.name.rpartition(".")[0]] if "." in r.name else model
            self._handles.append(
                parent.register_forward_pre_hook(self._shape_hook(r.layer), with_kwargs=True)
            )
            self._handles.append(r.module.register_forward_hook(self._route_hook(r)))
        setattr(model, _ATTACHED, self)

    # -------------------------------------------------------------------------------------------------- API
    @property
    def layers(self) -> list[int]:
        """The controllable layers, in order."""
        return [r.layer for r in self.routers]

    def info(self, layer: int) -> RouterInfo:
        """The :class:`RouterInfo` of ``layer``."""
        self._check_layer(layer)
        return self._by_layer[layer]

    def force(
        self,
        layer: int,
        position: int | Sequence[int] | str,
        experts: Sequence[int] | torch.Tensor,
        *,
        hard: bool = False,
    ) -> None:
        """Route the token(s) at ``position`` of layer ``layer`` only through ``experts`` (prefill calls).

        ``experts`` is a list of expert ids, or a ``(B, n)`` tensor giving each batch row its own set (the
        batched candidate evaluation of F-SOUR). ``position`` is an int, a sequence of ints, or ``"prefill"``
        (every prompt token).
        """
        self._add(layer, experts, position, keep=True, hard=hard)

    def mask(
        self,
        layer: int,
        experts: Sequence[int] | torch.Tensor,
        *,
        positions: int | Sequence[int] | str | None = None,
        hard: bool = False,
        spare_default: bool = False,
    ) -> None:
        """Remove ``experts`` from the router of ``layer`` (Phi = -inf) at ``positions`` (None: every token).

        ``spare_default=True`` keeps an expert wherever the unmodified router picks it for that token, so only
        deviations from the default routes are removed (default routing, hence benign behaviour, is unchanged).
        """
        self._add(layer, experts, positions, keep=False, hard=hard, spare_default=spare_default)

    def set_phi(self, layer: int, phi: torch.Tensor, *, hard: bool = False) -> None:
        """Add a dense mask for the prompt positions of ``layer``: ``phi`` is bool ``(T, K)`` or ``(B, T, K)``,
        True where Phi = -inf (applied to positions ``0..T-1`` of prefill calls)."""
        self._check_layer(layer)
        k = self._by_layer[layer].num_experts
        if not isinstance(phi, torch.Tensor) or phi.dtype != torch.bool:
            raise TypeError("phi must be a bool tensor (True = expert masked)")
        if phi.ndim == 2:
            phi = phi[None]
        if phi.ndim != 3 or phi.shape[-1] != k:
            raise ValueError(f"phi must have shape (T, {k}) or (B, T, {k}), got {tuple(phi.shape)}")
        self._rules[layer].append(_Rule(False, None, "prefill", hard, phi.detach().cpu()))

    def clear(self, *, hard: bool = False) -> None:
        """Drop the soft rules (and the hard ones too with ``hard=True``)."""
        for layer in self._rules:
            self._rules[layer] = [r for r in self._rules[layer] if r.hard and not hard]

    def routes(self) -> dict[int, torch.Tensor]:
        """The experts chosen in the last forward call: ``{layer: LongTensor (B, T, top_k)}``."""
        return dict(self._routes)

    def close(self) -> None:
        """Remove the hooks."""
        for h in self._handles:
            h.remove()
        self._handles.clear()
        if getattr(self.model, _ATTACHED, None) is self:
            setattr(self.model, _ATTACHED, None)

    def __enter__(self) -> RouterController:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ----------------------------------------------------------------------------------------------- checks
    def _check_layer(self, layer: int) -> None:
        if isinstance(layer, bool) or not isinstance(layer, int):
            raise TypeError(f"layer must be an int, got {type(layer).__name__}")
        if layer not in self._by_layer:
            raise ValueError(f"layer {layer} has no router; controllable layers: {self.layers}")

    def _add(
        self,
        layer: int,
        experts: Sequence[int] | torch.Tensor,
        positions: Any,
        *,
        keep: bool,
        hard: bool,
        spare_default: bool = False,
    ) -> None:
        self._check_layer(layer)
        info = self._by_layer[layer]
        e = torch.as_tensor(experts if not isinstance(experts, torch.Tensor) else experts.detach().cpu())
        if e.ndim not in (1, 2) or e.shape[-1] == 0:
            raise ValueError(
                f"experts must be a non-empty list of expert ids or a (B, n) tensor, got shape "
                f"{tuple(e.shape)}"
            )
        if e.dtype.is_floating_point or e.dtype == torch.bool:
            raise TypeError(f"experts must be integer expert ids, got dtype {e.dtype}")
        e = e.long()
        if int(e.min()) < 0 or int(e.max()) >= info.num_experts:
            shared = (
                " (the shared expert is not routed and cannot be forced or masked)"
                if info.shared_expert
                else ""
            )
            raise ValueError(
                f"expert ids must be in [0, {info.num_experts}) at layer {layer}, got "
                f"{sorted(set(e.flatten().tolist()))}{shared}"
            )
        if keep is False and hard and not spare_default:
            remaining = info.num_experts - len(set(e.flatten().tolist()))
            if remaining < info.top_k:
                raise ValueError(
                    f"masking {info.num_experts - remaining} of {info.num_experts} experts at layer "
                    f"{layer} leaves fewer than top_k={info.top_k}"
                )
        self._rules[layer].append(_Rule(keep, e, _positions(positions), hard, spare_default=spare_default))

    # ------------------------------------------------------------------------------------------------ hooks
    def _shape_hook(self, layer: int) -> Any:
        def hook(module: nn.Module, args: tuple, kwargs: dict) -> None:
            h = args[0] if args else kwargs.get("hidden_states")
            if isinstance(h, torch.Tensor) and h.ndim == 3:
                self._shape[layer] = (int(h.shape[0]), int(h.shape[1]))
            elif isinstance(h, torch.Tensor) and h.ndim == 2:
                self._shape[layer] = (1, int(h.shape[0]))

        return hook

    def _route_hook(self, info: RouterInfo) -> Any:
        def hook(module: nn.Module, args: tuple, output: tuple) -> tuple:
            logits = output[0]
            n = logits.shape[0]
            batch, seq = self._shape.get(info.layer, (1, n))
            if batch * seq != n:
                batch, seq = 1, n
            rules = self._rules[info.layer]
            if rules:
                default = torch.zeros(batch, seq, info.num_experts, dtype=torch.bool).scatter_(
                    -1, output[2].detach().cpu().reshape(batch, seq, -1), True
                )
                soft = self._mask(rules, False, batch, seq, info.num_experts, default, logits.device)
                hard = self._mask(rules, True, batch, seq, info.num_experts, default, logits.device)
                if soft is not None or hard is not None:
                    if soft is None:
                        mask = hard
                    elif hard is None:
                        mask = soft
                    else:
                        mask = soft | hard
                        # a hard rule (defence) wins where the two together leave no expert
                        dead = mask.all(-1, keepdim=True)
                        mask = torch.where(dead, hard, mask)
                    if bool(mask.all(-1).any()):
                        raise ValueError(
                            f"the routing rules at layer {info.layer} leave some token no expert "
                            "(two forced expert sets that do not overlap?)"
                        )
                    weights, idx = route(logits, info.top_k, info.renormalize, mask)
                    output = (logits.masked_fill(mask, float("-inf")), weights, idx)
            self._routes[info.layer] = output[2].detach().reshape(batch, seq, -1)
            return output

        return hook

    @staticmethod
    def _mask(
        rules: list[_Rule],
        hard: bool,
        batch: int,
        seq: int,
        k: int,
        default: torch.Tensor,
        device: torch.device,
    ) -> torch.Tensor | None:
        mask = None
        for rule in rules:
            if rule.hard is not hard:
                continue
            if rule.positions is None:
                pos = torch.arange(seq)
            elif seq == 1:  # a decode step: positional rules act on the prompt (prefill) only
                continue
            elif rule.positions == "prefill":
                pos = torch.arange(seq)
            else:
                pos = torch.tensor([p for p in rule.positions if p < seq], dtype=torch.long)
                if not len(pos):
                    continue
            if rule.phi is not None:
                if mask is None:
                    mask = torch.zeros(batch, seq, k, dtype=torch.bool)
                phi = rule.phi[:, :seq]
                if phi.shape[0] not in (1, batch):
                    raise ValueError(f"a per-row Phi has {phi.shape[0]} rows but the batch has {batch}")
                mask[:, : phi.shape[1]] |= phi
                continue
            e = rule.experts
            if e.ndim == 1:
                e = e.expand(batch, -1)
            elif e.shape[0] != batch:
                raise ValueError(f"a per-row expert rule has {e.shape[0]} rows but the batch has {batch}")
            chosen = torch.zeros(batch, k, dtype=torch.bool).scatter_(1, e, True)  # (B, K)
            rows = (~chosen if rule.keep else chosen)[:, None, :]  # True = Phi -inf
            if rule.spare_default:
                rows = rows & ~default[:, pos]
            if mask is None:
                mask = torch.zeros(batch, seq, k, dtype=torch.bool)
            mask[:, pos] |= rows
        return None if mask is None else mask.reshape(batch * seq, k).to(device)


def _positions(positions: Any) -> tuple[int, ...] | str | None:
    if positions is None or positions == "prefill":
        return positions
    if isinstance(positions, str):
        raise ValueError(
            f"positions must be an int, a sequence of ints, 'prefill' or None, got {positions!r}"
        )
    items = [positions] if isinstance(positions, int) else list(positions)
    if not items or any(isinstance(p, bool) or not isinstance(p, int) or p < 0 for p in items):
        raise ValueError(f"positions must be non-negative ints, got {positions!r}")
    return tuple(int(p) for p in items)


def disable_routes(
    model: nn.Module,
    bans: dict[int, Sequence[int]],
    *,
    spare_default: bool = True,
    controller: RouterController | None = None,
) -> RouterController:
    """Safety-aware route disabling: routes into ``bans[layer]`` experts are disabled for every token (hard rules).

    With ``spare_default`` (default) an expert stays available where the unmodified router itself picks it, so
    only routes that *deviate* into banned experts are disabled and default behaviour is unchanged; with
    ``spare_default=False`` the experts are removed outright. Hard rules win over soft (attack) routes on the same
    controller. Returns the controller (new unless one is passed); close it to lift the bans.
    """
    rc = controller or RouterController(model)
    for layer, experts in bans.items():
        if len(experts):
            rc.mask(layer, list(experts), hard=True, spare_default=spare_default)
    return rc


class RouteDropout:
    """Route dropout for training: each token's route is replaced, with probability ``rate``, by a random set of
    top_k experts (every router of the model, every forward call in training mode).

    For a token chosen by dropout the router's rule runs on the logits with every expert outside a uniformly random
    top_k-subset S masked,

        r' = r + Phi_S,   p' = softmax(r'),   (w', idx') = top-k(p')   (-> renormalised as the router does),

    so the block runs the experts of S with weights that still depend on (and train) the router; other tokens keep
    their own route. The router logits returned for the load-balancing loss are the unmasked ones. A model trained
    this way cannot rely on any single (token, layer) route, which is the world issue 52 asks for: random route
    perturbations of an attack's size must not flip its behaviour. Calls in eval mode are untouched.

    Args:
        model: a ``transformers`` MoE model (see :func:`find_routers`).
        rate: the probability that a token's route is replaced, in [0, 1].
        seed: seed of the draws (a ``torch.Generator`` of its own: the same seed gives the same training).

    Use as a context manager around training (hooks removed on exit) or call :meth:`close`.

    Example:
        >>> from icml26.common.tiny_lm import tiny_causal_lm
        >>> import torch
        >>> model = tiny_causal_lm(50, family="mixtral", layers=2, experts=4, top_k=2, seed=0).train()
        >>> with RouteDropout(model, rate=1.0, seed=0) as rd:
        ...     _ = model(torch.tensor([[5, 6, 7, 8]]))
        >>> rd.dropped, rd.seen
        (8, 8)

    Reference: route dropout is this project's world (issue 52); the router rule is that of
    Jiang et al., ICML 2026 (arXiv 2602.08621), see :func:`route`.
    """

    def __init__(self, model: nn.Module, rate: float, *, seed: int = 0):
        if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0.0 <= float(rate) <= 1.0:
            raise ValueError(f"rate must be a probability in [0, 1], got {rate!r}")
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise TypeError(f"seed must be an int, got {type(seed).__name__}")
        self.routers = find_routers(model)
        self.rate = float(rate)
        self.generator = torch.Generator().manual_seed(seed)
        self.dropped = 0
        """tokens x routers whose route was replaced so far"""
        self.seen = 0
        """tokens x routers routed in training mode so far"""
        self._handles = [r.module.register_forward_hook(self._hook(r)) for r in self.routers]

    def _hook(self, info: RouterInfo) -> Any:
        def hook(module: nn.Module, args: tuple, output: tuple) -> tuple:
            if not module.training or self.rate == 0.0:
                return output
            logits = output[0]
            n, k = logits.shape[0], info.num_experts
            drop = torch.rand(n, generator=self.generator) < self.rate
            subsets = torch.argsort(torch.rand(n, k, generator=self.generator), dim=-1)[:, : info.top_k]
            keep = torch.zeros(n, k, dtype=torch.bool).scatter_(-1, subsets, True)
            # Phi_S = -inf outside the random subset S, on the dropped tokens only
            mask = (~keep & drop[:, None]).to(logits.device)
            weights, idx = route(logits, info.top_k, info.renormalize, mask)
            self.dropped += int(drop.sum())
            self.seen += n
            return (logits, weights, idx)

        return hook

    def close(self) -> None:
        """Remove the hooks."""
        for h in self._handles:
            h.remove()
        self._handles.clear()

    def __enter__(self) -> RouteDropout:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
