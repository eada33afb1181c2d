"""Representation interventions on any Hugging Face causal LM: LoReFT, LoFiT and a concept-erasure hook.

All three are ``torch.nn.Module`` objects that act through forward hooks on a frozen base model, so the base
weights never change and ``save_pretrained`` of the base is untouched; each attaches on construction (or on
``attach()``), detaches with ``detach()`` or when used as a context manager, and stores its own weights in a
``state_dict`` (``save(path)`` / ``load(path, model)`` round-trip with a small JSON config).

- :class:`LoReFTIntervention` (Wu et al., 2024, "ReFT: Representation Finetuning for Language Models"):
  at chosen decoder layers, the residual stream h is edited in an r-dimensional subspace,

  .. math:: \\Phi(h) = h + R^\\top (W h + b - R h),\\qquad R \\in \\mathbb{R}^{r\\times d},\\ R R^\\top = I_r,

  with R kept orthonormal by ``torch.nn.utils.parametrizations.orthogonal`` (pyreft's ``LoreftIntervention``
  with the identity activation; written here because pyreft pins an old transformers).
- :class:`LoFiTIntervention` (Yin et al., 2024, "LoFiT: Localized Fine-tuning on LLM Representations"): on
  chosen attention heads, each head's output z (before the output projection) becomes
  ``(1 + A) * z + v`` with a learned per-head scale A and bias v; :func:`select_heads` is LoFiT's first step
  (scales on every head with an L1 penalty, heads ranked by the norm of their scale).
- :class:`ErasureHook`: applies a fitted eraser (``concept_erasure.LeaceEraser`` or any callable on ``(N, d)``
  tensors) to the residual stream after a decoder layer.

Positions: ``"all"`` acts on every position of every forward call (training and each generated token);
``"last"`` acts on the last position of each forward call: in a prompt's prefill that is the *decision position*
(the last prompt token, which predicts the first response token; prompts are left-padded by
``tiny_lm.generate``), in each later decoding step the newest token.

Example:
    >>> import torch
    >>> from icml26.common.tiny_lm import char_tokenizer, tiny_causal_lm
    >>> tok = char_tokenizer()
    >>> model = tiny_causal_lm(len(tok), hidden=32, layers=2, seed=0).eval()
    >>> ids = torch.tensor([tok("2+3=")["input_ids"]])
    >>> before = model(input_ids=ids).logits
    >>> with LoReFTIntervention(model, layers=[1], rank=2, seed=0) as reft:
    ...     with torch.no_grad():
    ...         _ = reft.reft[0].learned_source.weight.zero_(), reft.reft[0].learned_source.bias.zero_()
    ...     torch.allclose(model(input_ids=ids).logits, before, atol=1e-5)   # W = 0, b = 0: h -> h - R^T R h
    False
    >>> torch.equal(model(input_ids=ids).logits, before)                  # detached: the base model again
    True
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

POSITIONS = ("all", "last")


# --------------------------------------------------------------------------------------------- model anatomy
def decoder_layers(model: Any) -> nn.ModuleList:
    """The decoder blocks of a causal LM (Llama/Qwen/Mistral/MoE ``model.model.layers``, GPT-2
    ``transformer.h``, GPT-NeoX ``gpt_neox.layers``).

    Raises:
        TypeError: the model has none of these layouts.
    """
    for path in ("model.layers", "transformer.h", "gpt_neox.layers", "model.decoder.layers"):
        obj = model
        for part in path.split("."):
            obj = getattr(obj, part, None)
            if obj is None:
                break
        if isinstance(obj, nn.ModuleList) and len(obj) > 0:
            return obj
    raise TypeError(f"{type(model).__name__} has no decoder layers at model.layers, transformer.h, "
                    "gpt_neox.layers or model.decoder.layers")


def attention_output_projection(layer: nn.Module) -> nn.Module:
    """The attention output projection of a decoder block (its input is the concatenation of head outputs)."""
    for path in ("self_attn.o_proj", "attn.c_proj", "attention.dense", "self_attn.out_proj"):
        obj: Any = layer
        for part in path.split("."):
            obj = getattr(obj, part, None)
            if obj is None:
                break
        if isinstance(obj, nn.Module):
            return obj
    raise TypeError(f"{type(layer).__name__} has no attention output projection (self_attn.o_proj, attn.c_proj, "
                    "attention.dense, self_attn.out_proj)")


def head_layout(model: Any) -> tuple[int, int]:
    """``(num_attention_heads, head_dim)`` from the model's config."""
    cfg = model.config
    heads = getattr(cfg, "num_attention_heads", None) or getattr(cfg, "n_head", None)
    if not heads:
        raise TypeError(f"{type(model).__name__}'s config names no num_attention_heads")
    hidden = getattr(cfg, "hidden_size", None) or getattr(cfg, "n_embd", None)
    head_dim = getattr(cfg, "head_dim", None) or hidden // heads
    return int(heads), int(head_dim)


def hidden_size(model: Any) -> int:
    cfg = model.config
    return int(getattr(cfg, "hidden_size", None) or cfg.n_embd)


def check_layers(model: Any, layers: Iterable[int], name: str = "layers") -> list[int]:
    """Validate decoder-layer indices (0-based, no negatives) and return them as a sorted unique list."""
    n = len(decoder_layers(model))
    out = []
    for layer in layers:
        if isinstance(layer, bool) or not isinstance(layer, (int, np.integer)):
            raise TypeError(f"{name} must hold ints, got {layer!r}")
        if not 0 <= int(layer) < n:
            raise ValueError(f"{name}: layer {int(layer)} does not exist; the model has decoder layers 0..{n - 1}")
        out.append(int(layer))
    if not out:
        raise ValueError(f"{name} must name at least one decoder layer")
    return sorted(set(out))


def _check_positions(positions: str) -> str:
    if positions not in POSITIONS:
        raise ValueError(f"positions must be one of {POSITIONS}, got {positions!r}")
    return positions


def _replace_output(output: Any, new: torch.Tensor) -> Any:
    if isinstance(output, tuple):
        return (new, *output[1:])
    return new


def _hidden_of(output: Any) -> torch.Tensor:
    return output[0] if isinstance(output, tuple) else output


def _apply_at(h: torch.Tensor, fn: Callable[[torch.Tensor], torch.Tensor], positions: str) -> torch.Tensor:
    if positions == "all":
        return fn(h)
    last = fn(h[:, -1:, :])
    return torch.cat([h[:, :-1, :], last], dim=1)


class _Hooked(nn.Module):
    """Shared attach / detach / context-manager behaviour of the hook-based interventions."""

    def __init__(self, model: Any):
        super().__init__()
        object.__setattr__(self, "model", model)  # not a submodule: its weights are not ours
        self._handles: list[Any] = []

    @property
    def attached(self) -> bool:
        return bool(self._handles)

    def attach(self) -> _Hooked:
        if not self._handles:
            self._handles = self._register()
        return self

    def detach(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []

    def _register(self) -> list[Any]:
        raise NotImplementedError

    def __enter__(self) -> _Hooked:
        return self.attach()

    def __exit__(self, *exc: object) -> None:
        self.detach()

    # -- persistence ------------------------------------------------------------------------------------
    def config(self) -> dict[str, Any]:
        raise NotImplementedError

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write ``intervention.json`` (class and config) and ``intervention.pt`` (state dict) into ``path``."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        (path / "intervention.json").write_text(json.dumps({"class": type(self).__name__, **self.config()},
                                                           indent=2))
        torch.save(self.state_dict(), path / "intervention.pt")
        return path


def load_intervention(path: str | os.PathLike[str], model: Any, *, attach: bool = True) -> _Hooked:
    """Rebuild a saved :class:`LoReFTIntervention` or :class:`LoFiTIntervention` on ``model``."""
    path = Path(path)
    if not (path / "intervention.json").is_file():
        raise FileNotFoundError(f"{path} holds no saved intervention (intervention.json missing)")
    cfg = json.loads((path / "intervention.json").read_text())
    cls = {"LoReFTIntervention": LoReFTIntervention, "LoFiTIntervention": LoFiTIntervention}.get(cfg.pop("class"))
    if cls is None:
        raise ValueError(f"{path}: unknown intervention class")
    if cls is LoFiTIntervention:
        cfg["heads"] = [tuple(h) for h in cfg["heads"]]
    out = cls(model, **cfg, attach=False)
    state = torch.load(path / "intervention.pt", weights_only=True)
    out.load_state_dict(state)
    return out.attach() if attach else out


# ----------------------------------------------------------------------------------------------------- LoReFT
class LoReFTBlock(nn.Module):
    """One layer's LoReFT edit Phi(h) = h + R^T (W h + b - R h) with orthonormal rows of R (rank r)."""

    def __init__(self, d: int, rank: int):
        super().__init__()
        rotate = nn.Linear(d, rank, bias=False)
        nn.init.orthogonal_(rotate.weight)
        # R = rotate.weight (r x d), kept with orthonormal rows
        self.rotate = nn.utils.parametrizations.orthogonal(rotate)
        self.learned_source = nn.Linear(d, rank)

    @property
    def R(self) -> torch.Tensor:
        return self.rotate.weight

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        dtype = h.dtype
        x = h.to(self.learned_source.weight.dtype)
        R = self.R
        # $$\Phi(h) = h + R^\top (W h + b - R h)$$   (ReFT eq. 2, LoReFT)
        out = x + (self.learned_source(x) - x @ R.T) @ R
        return out.to(dtype)


class LoReFTIntervention(_Hooked):
    """LoReFT on the residual stream after each of ``layers`` (see the module docstring).

    Args:
        model: a causal LM (its weights are left alone; freeze them when training this module).
        layers: 0-based decoder-layer indices.
        rank: r, the dimension of the edited subspace (``1 <= r <= hidden size``).
        positions: ``"all"`` or ``"last"``.
        seed: seed of the initial R (orthogonal) and W, b (PyTorch's Linear init).
        attach: register the hooks now.

    Example:
        >>> from icml26.common.tiny_lm import char_tokenizer, tiny_causal_lm
        >>> model = tiny_causal_lm(len(char_tokenizer()), hidden=32, layers=2)
        >>> reft = LoReFTIntervention(model, layers=[0, 1], rank=4)
        >>> sum(p.numel() for p in reft.parameters())       # per layer: R (4 x 32) + W (4 x 32) + b (4)
        520
        >>> reft.detach()
    """

    def __init__(self, model: Any, layers: Sequence[int], rank: int = 4, positions: str = "all", seed: int = 0,
                 attach: bool = True):
        super().__init__(model)
        self.layers = check_layers(model, layers)
        d = hidden_size(model)
        if isinstance(rank, bool) or not isinstance(rank, int) or not 1 <= rank <= d:
            raise ValueError(f"rank must be an int in [1, {d}], got {rank!r}")
        self.rank = rank
        self.positions = _check_positions(positions)
        self.seed = seed
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.reft = nn.ModuleList([LoReFTBlock(d, rank) for _ in self.layers])
        if attach:
            self.attach()

    def _register(self) -> list[Any]:
        blocks = decoder_layers(self.model)
        handles = []
        for layer, block in zip(self.layers, self.reft, strict=True):
            def hook(_module: nn.Module, _inputs: Any, output: Any, block: nn.Module = block) -> Any:
                return _replace_output(output, _apply_at(_hidden_of(output), block, self.positions))
            handles.append(blocks[layer].register_forward_hook(hook))
        return handles

    def config(self) -> dict[str, Any]:
        return {"layers": self.layers, "rank": self.rank, "positions": self.positions, "seed": self.seed}


# ------------------------------------------------------------------------------------------------------ LoFiT
class LoFiTIntervention(_Hooked):
    """LoFiT on chosen attention heads: each head output z becomes ``(1 + A) * z + v`` before the output
    projection (a forward pre-hook on it).

    Args:
        model: a causal LM.
        heads: ``[(layer, head), ...]`` (0-based); ``select_heads`` chooses them as LoFiT does.
        scale: learn the per-head scale A (LoFiT's step 1); the bias v is always learned unless ``bias=False``.
        bias: learn the per-head bias v (LoFiT's step 2).
        positions: ``"all"`` or ``"last"``.
        attach: register the hooks now.

    Both A and v start at zero, so a fresh module leaves the model unchanged.
    """

    def __init__(self, model: Any, heads: Sequence[tuple[int, int]], scale: bool = False, bias: bool = True,
                 positions: str = "all", attach: bool = True):
        super().__init__(model)
        n_heads, head_dim = head_layout(model)
        heads = [tuple(h) for h in heads]
        if not heads:
            raise ValueError("heads must name at least one (layer, head) pair")
        check_layers(model, [h[0] for h in heads], name="heads")
        for layer, head in heads:
            if isinstance(head, bool) or not isinstance(head, (int, np.integer)) or not 0 <= head < n_heads:
                raise ValueError(f"heads: head {head!r} of layer {layer} does not exist; the model has heads "
                                 f"0..{n_heads - 1}")
        if len(set(heads)) != len(heads):
            raise ValueError(f"heads has duplicates: {heads}")
        if not (scale or bias):
            raise ValueError("at least one of scale and bias must be learned")
        self.heads = [(int(a), int(b)) for a, b in heads]
        self.use_scale, self.use_bias = scale, bias
        self.positions = _check_positions(positions)
        self.n_heads, self.head_dim = n_heads, head_dim
        self.scale = nn.Parameter(torch.zeros(len(self.heads), head_dim), requires_grad=scale)
        self.bias = nn.Parameter(torch.zeros(len(self.heads), head_dim), requires_grad=bias)
        if attach:
            self.attach()

    def _register(self) -> list[Any]:
        blocks = decoder_layers(self.model)
        handles = []
        for layer in sorted({a for a, _ in self.heads}):
            rows = [i for i, (a, _) in enumerate(self.heads) if a == layer]
            idx = torch.tensor([self.heads[i][1] for i in rows])

            def pre_hook(_module: nn.Module, args: tuple[Any, ...], rows: list[int] = rows,
                         idx: torch.Tensor = idx) -> Any:
                z = args[0]
                return (_apply_at(z, lambda t: self._edit(t, rows, idx), self.positions), *args[1:])

            handles.append(attention_output_projection(blocks[layer]).register_forward_pre_hook(pre_hook))
        return handles

    def _edit(self, z: torch.Tensor, rows: list[int], idx: torch.Tensor) -> torch.Tensor:
        shape = z.shape
        zh = z.reshape(*shape[:-1], self.n_heads, self.head_dim)
        sel = zh[..., idx, :].float()
        a = self.scale[rows] if self.use_scale else torch.zeros_like(self.scale[rows])
        v = self.bias[rows] if self.use_bias else torch.zeros_like(self.bias[rows])
        # $$z^{(l,i)} \leftarrow (1 + A^{(l,i)}) \odot z^{(l,i)} + v^{(l,i)}$$   (LoFiT eqs. 1-2)
        new = (1.0 + a) * sel + v
        zh = zh.clone()
        zh[..., idx, :] = new.to(z.dtype)
        return zh.reshape(shape)

    def config(self) -> dict[str, Any]:
        return {"heads": [list(h) for h in self.heads], "scale": self.use_scale, "bias": self.use_bias,
                "positions": self.positions}


def all_heads(model: Any) -> list[tuple[int, int]]:
    """Every (layer, head) pair of the model."""
    n_heads, _ = head_layout(model)
    return [(layer, h) for layer in range(len(decoder_layers(model))) for h in range(n_heads)]


def select_heads(model: Any, tokenizer: Any, prompts: Sequence[str], completions: Sequence[str], k: int = 8, *,
                 steps: int = 100, lr: float = 5e-3, l1: float = 1e-3, batch_size: int = 32,
                 seed: int = 0) -> list[tuple[int, int]]:
    """LoFiT's head selection: learn a scale A on every head with an L1 penalty, keep the k heads of largest
    ``||A||_1``.

    Loss: completion-token NLL + ``l1 * sum_heads ||A||_1`` (LoFiT eq. 3). Returns the heads, best first.
    """
    heads = all_heads(model)
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= len(heads):
        raise ValueError(f"k must be an int in [1, {len(heads)}], got {k!r}")
    with LoFiTIntervention(model, heads, scale=True, bias=False) as lofit:
        train_intervention(model, lofit, tokenizer, prompts, completions, steps=steps, lr=lr,
                           batch_size=batch_size, seed=seed,
                           penalty=lambda: l1 * lofit.scale.abs().sum())
        norms = lofit.scale.detach().abs().sum(-1)
    order = torch.argsort(norms, descending=True, stable=True)[:k]
    return [heads[int(i)] for i in order]


# ----------------------------------------------------------------------------------------------------- erasure
class ErasureHook(_Hooked):
    """Apply ``eraser`` to the residual stream after decoder layer ``layer`` at ``positions``.

    Args:
        model: a causal LM.
        layer: 0-based decoder-layer index.
        eraser: a fitted ``concept_erasure.LeaceEraser`` (or any callable mapping ``(N, d)`` to ``(N, d)``).
        positions: ``"last"`` (default: the decision position in prefill, then each new token) or ``"all"``.
    """

    def __init__(self, model: Any, layer: int, eraser: Callable[[torch.Tensor], torch.Tensor],
                 positions: str = "last", attach: bool = True):
        super().__init__(model)
        self.layer = check_layers(model, [layer], name="layer")[0]
        if not callable(eraser):
            raise TypeError(f"eraser must be callable (e.g. a fitted LeaceEraser), got {type(eraser).__name__}")
        self.eraser = eraser
        self.positions = _check_positions(positions)
        if attach:
            self.attach()

    def _register(self) -> list[Any]:
        def hook(_module: nn.Module, _inputs: Any, output: Any) -> Any:
            h = _hidden_of(output)

            def erase(t: torch.Tensor) -> torch.Tensor:
                flat = t.reshape(-1, t.shape[-1])
                return self.eraser(flat.float()).to(t.dtype).reshape(t.shape)

            return _replace_output(output, _apply_at(h, erase, self.positions))

        return [decoder_layers(self.model)[self.layer].register_forward_hook(hook)]

    def config(self) -> dict[str, Any]:
        return {"layer": self.layer, "positions": self.positions}

    def save(self, path: str | os.PathLike[str]) -> Path:
        raise TypeError("an ErasureHook holds no trained weights; save its eraser (torch.save(eraser)) and rebuild "
                        "the hook with ErasureHook(model, layer, eraser)")


# ----------------------------------------------------------------------------------------------- training etc.
def freeze(model: Any) -> None:
    """Set ``requires_grad = False`` on every base-model parameter."""
    for p in model.parameters():
        p.requires_grad_(False)


class InterventionTrainer:
    """A resumable :func:`train_intervention`: ``advance(n)`` takes ``n`` more steps of the same AdamW run.

    The loss is the completion-token NLL, :math:`-\\sum_t m_t \\log p(y_t) / \\sum_t m_t` (plus ``penalty()``); the
    batches are drawn with ``seed`` and the optimizer state is kept between calls, so ``advance(a)`` then
    ``advance(b)`` ends exactly where one ``advance(a + b)`` (or ``train_intervention(steps=a + b)``) ends: a
    constant-rate run can be read at increasing budgets without retraining.

    Args:
        model: the causal LM whose forward computes the loss (with the intervention attached); put in eval mode
            while stepping (dropout off: a fixed function), its mode restored after.
        params: the parameters to train (the intervention's, or a fine-tuned copy's own).
        tokenizer: the tokenizer (with a pad token).
        prompts, completions: the training pairs (loss on completion tokens and EOS).
        lr, batch_size, seed, weight_decay: AdamW settings; batches drawn with ``seed``.
        penalty: an extra loss term (LoFiT's L1 on the scales).

    Raises:
        ValueError: empty or unequal prompts and completions, or no trainable parameter.

    Example:
        >>> from icml26.common.tiny_lm import char_tokenizer, tiny_causal_lm
        >>> tok = char_tokenizer()
        >>> model = tiny_causal_lm(len(tok), hidden=32, layers=1, seed=0)
        >>> freeze(model)
        >>> reft = LoReFTIntervention(model, layers=[0], rank=2)
        >>> trainer = InterventionTrainer(model, reft.parameters(), tok, ["1+1="], ["2"], lr=1e-2)
        >>> len(trainer.advance(3)), trainer.step
        (3, 3)
        >>> reft.detach()
    """

    def __init__(self, model: Any, params: Iterable[nn.Parameter], tokenizer: Any, prompts: Sequence[str],
                 completions: Sequence[str], *, lr: float = 1e-2, batch_size: int = 32, seed: int = 0,
                 weight_decay: float = 0.0, penalty: Callable[[], torch.Tensor] | None = None):
        if len(prompts) != len(completions) or not prompts:
            raise ValueError(f"prompts and completions must be non-empty and of equal length, got {len(prompts)} "
                             f"and {len(completions)}")
        self.params = [p for p in params if p.requires_grad]
        if not self.params:
            raise ValueError("the intervention has no trainable parameters")
        self.model, self.tokenizer = model, tokenizer
        self.prompts, self.completions = list(prompts), list(completions)
        self.batch_size, self.penalty = batch_size, penalty
        self.opt = torch.optim.AdamW(self.params, lr=lr, weight_decay=weight_decay)
        self.rng = np.random.default_rng(seed)
        self.step = 0
        """steps taken so far"""

    def advance(self, steps: int) -> list[float]:
        """Take ``steps`` more steps; returns their losses.

        Raises:
            ValueError: ``steps`` is not a non-negative int. FloatingPointError: a non-finite loss.
        """
        from ..common.tiny_lm import completion_batch, completion_logps

        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
            raise ValueError(f"steps must be a non-negative int, got {steps!r}")
        was_training = self.model.training
        self.model.eval()  # dropout off: the base model is a fixed function
        losses = []
        try:
            for _ in range(steps):
                n = len(self.prompts)
                idx = self.rng.integers(0, n, size=min(self.batch_size, n))
                batch = completion_batch(self.tokenizer, [self.prompts[i] for i in idx],
                                         [self.completions[i] for i in idx])
                logps, mask = completion_logps(self.model, batch)
                # $$\mathcal{L} = -\sum_t m_t \log p_\theta(y_t \mid y_{<t}, x) / \sum_t m_t$$
                loss = -(logps * mask).sum() / mask.sum()
                if self.penalty is not None:
                    loss = loss + self.penalty()
                if not torch.isfinite(loss):
                    raise FloatingPointError(f"intervention loss is {float(loss.detach())}")
                self.opt.zero_grad(set_to_none=True)
                loss.backward()
                self.opt.step()
                self.step += 1
                losses.append(float(loss.detach()))
        finally:
            self.model.train(was_training)
        return losses


def train_intervention(model: Any, intervention: nn.Module, tokenizer: Any, prompts: Sequence[str],
                       completions: Sequence[str], *, steps: int, lr: float = 1e-2, batch_size: int = 32,
                       seed: int = 0, weight_decay: float = 0.0,
                       penalty: Callable[[], torch.Tensor] | None = None) -> list[float]:
    """Train only ``intervention``'s parameters on completion-token NLL with the base model frozen.

    Args:
        model: the base causal LM (its parameters are frozen here and stay frozen).
        intervention: an attached intervention module.
        tokenizer: its tokenizer (with a pad token).
        prompts, completions: the training pairs (loss on completion tokens and EOS).
        steps, lr, batch_size, seed, weight_decay: AdamW settings; batches drawn with ``seed``.
        penalty: an extra loss term (LoFiT's L1 on the scales).

    Returns:
        The loss of every step (one :class:`InterventionTrainer` advanced ``steps`` steps).
    """
    if len(prompts) != len(completions) or not prompts:
        raise ValueError(f"prompts and completions must be non-empty and of equal length, got {len(prompts)} and "
                         f"{len(completions)}")
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    freeze(model)
    trainer = InterventionTrainer(model, intervention.parameters(), tokenizer, prompts, completions, lr=lr,
                                  batch_size=batch_size, seed=seed, weight_decay=weight_decay, penalty=penalty)
    return trainer.advance(steps)


@torch.no_grad()
def decision_states(model: Any, tokenizer: Any, texts: Sequence[str], layer: int, *,
                    batch_size: int = 128) -> torch.Tensor:
    """The residual stream after decoder layer ``layer`` at the last token of each text (its decision position),
    with whatever interventions are attached; ``(N, d)`` float32.

    Raises:
        ValueError: an empty text (no decision position) or a layer that does not exist.
    """
    layer = check_layers(model, [layer], name="layer")[0]
    if isinstance(texts, str):
        raise TypeError("texts must be a sequence of strings, not one string")
    for i, t in enumerate(texts):
        if not isinstance(t, str) or not tokenizer(t, add_special_tokens=False)["input_ids"]:
            raise ValueError(f"texts[{i}] = {t!r} has no token, hence no decision position")
    out: list[torch.Tensor] = []
    side = tokenizer.padding_side
    tokenizer.padding_side = "left"
    captured: list[torch.Tensor] = []
    handle = decoder_layers(model)[layer].register_forward_hook(
        lambda _m, _i, o: captured.append(_hidden_of(o)[:, -1, :].detach().float().clone()))
    try:
        model.eval()
        for i in range(0, len(texts), batch_size):
            enc = tokenizer(list(texts[i:i + batch_size]), return_tensors="pt", padding=True, add_special_tokens=False)
            captured.clear()
            model(**enc)
            out.append(captured[-1])
    finally:
        handle.remove()
        tokenizer.padding_side = side
    return torch.cat(out)
