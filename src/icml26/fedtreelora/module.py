r"""The client-side module of FedTreeLoRA: a LoRA layer that mixes a cluster expert with an external expert.

For a frozen projection W_0 of layer l, client k holds a **cluster expert** (A^clus, B^clus: trainable, the
average of its cluster's LoRA at that layer), an **external expert** (A^ext, B^ext: frozen buffers, the average
of the other clients' LoRA) and a learnable gate lambda = sigmoid(logit):

$$h_l(x) = W_{0,l}\,x + \tfrac{\alpha}{r}\big[\lambda_{l,k}\,B^{clus}_l A^{clus}_l x
          + (1 - \lambda_{l,k})\,B^{ext}_l A^{ext}_l x\big]$$

Without an external expert (a layer every client shares, or a plain-LoRA baseline) the gate is fixed to 1 and
the layer is exactly peft's LoRA ``W_0 x + (alpha / r) B A x`` (tested against peft). One gate per adapted
projection (the paper's lambda_{l,k} is per layer; see the README's deviations).

The state of the adapters is exchanged under **peft's key names** (``base_model.model.<module>.lora_A.weight``,
what ``peft.get_peft_model_state_dict`` returns), so a payload from this module loads into a peft model and back
(``to_peft_state_dict`` / ``from_peft_state_dict``); ``from_peft_model`` takes over a peft LoRA model and
``export_peft`` writes a client's personalised model (both experts and its gate) as a standard rank-2r peft
LoRA adapter.

Example:
    >>> import torch
    >>> layer = MixedLoRALinear(torch.nn.Linear(8, 6), r=2, alpha=4, seed=0)
    >>> x = torch.randn(3, 8)
    >>> bool(torch.allclose(layer(x), layer.base(x)))      # B starts at zero, as in peft
    True
    >>> layer.set_external(torch.randn(2, 8), torch.randn(6, 2))
    >>> round(layer.mix, 3)                                  # lambda = sigmoid(0) until trained
    0.5

Reference: FedTreeLoRA, "Reconciling Statistical and Functional Heterogeneity in Federated LoRA Fine-Tuning",
ICML 2026 (cluster and external experts, learnable lambda; from a secondary summary of the paper); LoRA: Hu et
al., ICLR 2022; peft's ``LoraLayer`` for the initialisation and scaling.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from .core import layer_index

#: peft's prefix of the adapter keys of a ``PeftModel`` (``base_model.model.`` + the module's name)
PEFT_PREFIX = "base_model.model."


def _io_features(base: nn.Module) -> tuple[int, int]:
    """(in, out) features of an ``nn.Linear`` or a GPT-2 style ``Conv1D`` (weight stored as (in, out))."""
    if isinstance(base, nn.Linear):
        return base.in_features, base.out_features
    if type(base).__name__ == "Conv1D" and hasattr(base, "weight") and base.weight.dim() == 2:
        return int(base.weight.shape[0]), int(base.weight.shape[1])
    raise TypeError(f"can only adapt nn.Linear or transformers' Conv1D, got {type(base).__name__}")


def init_lora_A(r: int, d_in: int, seed: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """peft's initialisation of A, ``kaiming_uniform_(a=sqrt(5))`` on (r, in): U(-1/sqrt(in), 1/sqrt(in)), seeded."""
    g = torch.Generator().manual_seed(int(seed))
    bound = 1.0 / math.sqrt(d_in)
    return torch.empty(r, d_in, dtype=dtype).uniform_(-bound, bound, generator=g)


class MixedLoRALinear(nn.Module):
    r"""A frozen linear map plus lambda times a trainable cluster LoRA plus (1 - lambda) times a frozen external LoRA.

    $$y = W_0 x + s\,[\lambda B_c A_c x + (1 - \lambda) B_e A_e x],\quad s = \alpha / r,\ \lambda = \sigma(\ell)$$

    Args:
        base: the frozen projection (``nn.Linear`` or ``Conv1D``); its parameters are set to
            ``requires_grad=False``.
        r: LoRA rank (> 0).
        alpha: LoRA alpha; the scaling is ``alpha / r`` as in peft.
        seed: seed of A's initialisation (peft's ``kaiming_uniform_(a=sqrt(5))``; B starts at zero).

    Attributes:
        lora_A, lora_B: the cluster expert (``nn.Parameter``, shapes (r, in) and (out, r), peft's layout).
        ext_A, ext_B: the external expert (buffers), used only after ``set_external``.
        mix_logit: the gate's logit (``nn.Parameter``, starts at 0 so lambda = 0.5).
    """

    def __init__(self, base: nn.Module, r: int = 4, alpha: float = 8.0, seed: int = 0):
        super().__init__()
        if isinstance(r, bool) or not isinstance(r, int) or r <= 0:
            raise ValueError(f"r must be a positive int, got {r!r}")
        if not (isinstance(alpha, (int, float)) and math.isfinite(alpha) and alpha > 0):
            raise ValueError(f"alpha must be a positive finite number, got {alpha!r}")
        d_in, d_out = _io_features(base)
        self.base = base
        for p in self.base.parameters():
            p.requires_grad_(False)
        self.r, self.alpha, self.scaling = r, float(alpha), float(alpha) / r
        self.in_features, self.out_features = d_in, d_out
        dtype = next(base.parameters()).dtype
        self.lora_A = nn.Parameter(init_lora_A(r, d_in, seed, dtype))
        self.lora_B = nn.Parameter(torch.zeros(d_out, r, dtype=dtype))
        self.register_buffer("ext_A", torch.zeros(r, d_in, dtype=dtype))
        self.register_buffer("ext_B", torch.zeros(d_out, r, dtype=dtype))
        self.mix_logit = nn.Parameter(torch.zeros((), dtype=dtype))
        self.has_external = False

    @property
    def mix(self) -> float:
        """lambda, the weight of the cluster expert (1.0 when there is no external expert)."""
        return float(torch.sigmoid(self.mix_logit.detach())) if self.has_external else 1.0

    def set_external(self, A: torch.Tensor | np.ndarray | None, B: torch.Tensor | np.ndarray | None) -> None:
        """Set the frozen external expert (``None`` for none: the gate is then fixed to 1)."""
        if A is None or B is None:
            if (A is None) != (B is None):
                raise ValueError("give both A and B of the external expert, or neither")
            self.ext_A.zero_()
            self.ext_B.zero_()
            self.has_external = False
            return
        A, B = torch.as_tensor(A, dtype=self.ext_A.dtype), torch.as_tensor(B, dtype=self.ext_B.dtype)
        if A.shape != self.ext_A.shape or B.shape != self.ext_B.shape:
            raise ValueError(f"external expert shapes {tuple(A.shape)}, {tuple(B.shape)} do not match "
                             f"rank {self.r} LoRA of shapes {tuple(self.ext_A.shape)}, {tuple(self.ext_B.shape)}")
        self.ext_A.copy_(A)
        self.ext_B.copy_(B)
        self.has_external = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.base(x)
        clus = (x @ self.lora_A.t()) @ self.lora_B.t()
        if not self.has_external:
            # $$h = W_0 x + \frac{\alpha}{r} B A x$$  (plain LoRA: lambda fixed to 1)
            return y + self.scaling * clus
        lam = torch.sigmoid(self.mix_logit)
        ext = (x @ self.ext_A.t()) @ self.ext_B.t()
        # $$h = W_0 x + \frac{\alpha}{r}[\lambda B^{clus} A^{clus} x + (1 - \lambda) B^{ext} A^{ext} x]$$
        return y + self.scaling * (lam * clus + (1.0 - lam) * ext)

    def extra_repr(self) -> str:
        return f"in={self.in_features}, out={self.out_features}, r={self.r}, alpha={self.alpha}"


# --------------------------------------------------------------------------------------------- model level
def inject_mixed_lora(model: nn.Module, target_modules: Sequence[str] = ("q_proj", "v_proj"), r: int = 4,
                      alpha: float = 8.0, seed: int = 0) -> nn.Module:
    """Freeze ``model`` and replace every projection named in ``target_modules`` by a ``MixedLoRALinear``.

    Works on any ``transformers`` model (or any ``nn.Module``) whose target projections are ``nn.Linear`` or
    ``Conv1D`` inside numbered layers (``layers.3.self_attn.q_proj``, GPT-2's ``h.3.attn.c_attn``). Modified in
    place and returned.

    Args:
        model: the base model (its parameters are frozen).
        target_modules: last components of the module names to adapt (peft's ``target_modules``).
        r, alpha: LoRA rank and alpha (scaling alpha / r).
        seed: A's initialisation seed; module i gets ``seed + i`` (the same model, seed and targets always give
            the same initial adapters, so clients can start from one shared initialisation).

    Raises:
        ValueError: no module matches ``target_modules``, or it is already adapted.
    """
    if isinstance(target_modules, str) or not target_modules:
        raise TypeError(f"target_modules must be a non-empty sequence of names, got {target_modules!r}")
    if any(isinstance(m, MixedLoRALinear) for m in model.modules()):
        raise ValueError("model already holds MixedLoRALinear layers")
    for p in model.parameters():
        p.requires_grad_(False)
    names = [n for n, m in model.named_modules() if n and n.rsplit(".", 1)[-1] in set(target_modules)]
    if not names:
        raise ValueError(f"no module of {type(model).__name__} matches target_modules={list(target_modules)}")
    for i, name in enumerate(names):
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        layer_index(name + ".")  # every adapted module must sit in a numbered layer
        setattr(parent, child, MixedLoRALinear(getattr(parent, child), r=r, alpha=alpha, seed=seed + i))
    return model


def lora_modules(model: nn.Module) -> dict[str, MixedLoRALinear]:
    """The adapted modules of ``model`` by name, in model order."""
    out = {n: m for n, m in model.named_modules() if isinstance(m, MixedLoRALinear)}
    if not out:
        raise ValueError(f"{type(model).__name__} holds no MixedLoRALinear layer; call inject_mixed_lora first")
    return out


def peft_key(module_name: str, factor: str) -> str:
    """peft's state-dict key of factor ``"A"``/``"B"`` of the adapter on ``module_name``."""
    return f"{PEFT_PREFIX}{module_name}.lora_{factor}.weight"


def lora_keys(model: nn.Module) -> list[str]:
    """peft key names of every factor of ``model``'s adapters (A then B per module, model order)."""
    return [peft_key(n, f) for n in lora_modules(model) for f in ("A", "B")]


def get_lora_state(model: nn.Module, which: str = "clus") -> dict[str, np.ndarray]:
    """The cluster (``"clus"``) or external (``"ext"``) experts as float32 arrays under peft's key names."""
    if which not in ("clus", "ext"):
        raise ValueError(f"which must be 'clus' or 'ext', got {which!r}")
    out = {}
    for name, m in lora_modules(model).items():
        A, B = (m.lora_A, m.lora_B) if which == "clus" else (m.ext_A, m.ext_B)
        out[peft_key(name, "A")] = A.detach().cpu().numpy().astype(np.float32, copy=True)
        out[peft_key(name, "B")] = B.detach().cpu().numpy().astype(np.float32, copy=True)
    return out


def _check_state(model: nn.Module, state: Mapping[str, Any], where: str) -> dict[str, MixedLoRALinear]:
    modules = lora_modules(model)
    expected = {peft_key(n, f) for n in modules for f in ("A", "B")}
    got = set(state)
    if got != expected:
        missing, extra = sorted(expected - got)[:3], sorted(got - expected)[:3]
        raise ValueError(f"{where}: keys do not match the model's adapters (missing {missing}, unexpected {extra}); "
                         "are the target modules the same?")
    for name, m in modules.items():
        for f, ref in (("A", m.lora_A), ("B", m.lora_B)):
            value = np.asarray(state[peft_key(name, f)])
            if value.shape != tuple(ref.shape):
                raise ValueError(f"{where}: {peft_key(name, f)} has shape {value.shape}, the model's rank-{m.r} "
                                 f"adapter needs {tuple(ref.shape)} (mismatched LoRA ranks?)")
            if not np.all(np.isfinite(value)):
                raise ValueError(f"{where}: {peft_key(name, f)} holds NaN or Inf")
    return modules


@torch.no_grad()
def set_lora_state(model: nn.Module, clus: Mapping[str, Any], ext: Mapping[str, Any] | None = None,
                   mix_logits: Mapping[str, float] | None = None) -> None:
    """Load the cluster experts, and the external experts (``None``: no external expert, gate fixed to 1).

    ``ext`` may also leave out modules (a layer whose cluster is every client): those get no external expert.
    ``mix_logits`` maps module names to gate logits (a module left out gets logit 0, lambda = 1/2).
    """
    modules = _check_state(model, clus, "clus")
    for name, m in modules.items():
        m.lora_A.copy_(torch.as_tensor(np.asarray(clus[peft_key(name, "A")]), dtype=m.lora_A.dtype))
        m.lora_B.copy_(torch.as_tensor(np.asarray(clus[peft_key(name, "B")]), dtype=m.lora_B.dtype))
        ka, kb = peft_key(name, "A"), peft_key(name, "B")
        if ext is not None and ka in ext:
            m.set_external(np.asarray(ext[ka]), np.asarray(ext[kb]))
        else:
            m.set_external(None, None)
        m.mix_logit.fill_(float((mix_logits or {}).get(name, 0.0)))


def get_mix_logits(model: nn.Module) -> dict[str, float]:
    """Every adapted module's gate logit."""
    return {n: float(m.mix_logit) for n, m in lora_modules(model).items()}


def to_peft_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The cluster experts as a peft adapter state dict (``set_peft_model_state_dict`` loads it)."""
    return {k: torch.from_numpy(v) for k, v in get_lora_state(model, "clus").items()}


def from_peft_state_dict(model: nn.Module, state_dict: Mapping[str, torch.Tensor]) -> None:
    """Load a peft adapter state dict (``get_peft_model_state_dict``) as the cluster experts; no external expert.

    peft's keys may carry the adapter name (``lora_A.default.weight``) or not; both are accepted.
    """
    clean = {re.sub(r"\.lora_([AB])\.[^.]+\.weight$", r".lora_\1.weight", k): v.detach().cpu().numpy()
             for k, v in state_dict.items()}
    set_lora_state(model, clean)


def from_peft_model(peft_model: nn.Module, adapter_name: str = "default", seed: int = 0) -> nn.Module:
    """Take over a peft LoRA model: its base model with ``MixedLoRALinear`` layers holding the adapter's weights.

    Needs the ``hf`` extra. The peft model is unloaded (its base model is returned, adapted in place).
    """
    from ..common.optional import requires

    peft = requires("peft", extra="fedtreelora", purpose="reading a peft LoRA model")
    config = peft_model.peft_config[adapter_name]
    if getattr(config, "use_rslora", False) or getattr(config, "use_dora", False):
        raise ValueError("rsLoRA and DoRA adapters are not supported (plain LoRA only)")
    if getattr(config, "rank_pattern", None) or getattr(config, "alpha_pattern", None):
        raise ValueError("per-module rank or alpha patterns are not supported: every module needs the same rank")
    targets = config.target_modules
    if isinstance(targets, str):
        raise ValueError(f"a regex target_modules ({targets!r}) is not supported; give a list of module names")
    state = peft.get_peft_model_state_dict(peft_model, adapter_name=adapter_name)
    base = peft_model.unload()
    inject_mixed_lora(base, tuple(sorted(targets)), r=int(config.r), alpha=float(config.lora_alpha), seed=seed)
    from_peft_state_dict(base, state)
    return base


def export_peft(model: nn.Module) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    r"""A client's personalised adapters as one standard peft LoRA adapter of rank 2r.

    $$\lambda B_c A_c + (1 - \lambda) B_e A_e = [\lambda B_c \,|\, (1 - \lambda) B_e]\,[A_c; A_e]$$

    and peft's scaling alpha' / r' with r' = 2r, alpha' = 2 alpha keeps alpha / r. Returns ``(config_kwargs,
    state_dict)``: ``LoraConfig(**config_kwargs)`` plus ``set_peft_model_state_dict`` give the same outputs.
    """
    modules = lora_modules(model)
    ranks = {m.r for m in modules.values()}
    alphas = {m.alpha for m in modules.values()}
    if len(ranks) != 1 or len(alphas) != 1:
        raise ValueError(f"export needs one rank and alpha for every module, got ranks {ranks}, alphas {alphas}")
    sd = {}
    for name, m in modules.items():
        lam = m.mix
        sd[peft_key(name, "A")] = torch.cat([m.lora_A, m.ext_A]).detach().clone()
        sd[peft_key(name, "B")] = torch.cat([lam * m.lora_B, (1.0 - lam) * m.ext_B], dim=1).detach().clone()
    targets = sorted({n.rsplit(".", 1)[-1] for n in modules})
    r, alpha = ranks.pop(), alphas.pop()
    return {"r": 2 * r, "lora_alpha": 2 * alpha, "target_modules": targets, "lora_dropout": 0.0}, sd


def trainable_parameters(model: nn.Module, train_A: bool = True, train_B: bool = True,
                         train_mix: bool = True) -> list[nn.Parameter]:
    """Set ``requires_grad`` on the cluster experts' factors and gates as asked; return the trainable ones.

    A gate is trainable only where the module has an external expert.
    """
    out: list[nn.Parameter] = []
    for m in lora_modules(model).values():
        m.lora_A.requires_grad_(train_A)
        m.lora_B.requires_grad_(train_B)
        m.mix_logit.requires_grad_(train_mix and m.has_external)
        out += [p for p in (m.lora_A, m.lora_B, m.mix_logit) if p.requires_grad]
    return out


def count_adapter_parameters(model: nn.Module, parts: Iterable[str] = ("A", "B", "mix")) -> int:
    """Number of adapter parameters of the given parts (``"A"``, ``"B"``, ``"mix"``)."""
    parts = set(parts)
    n = 0
    for m in lora_modules(model).values():
        n += m.lora_A.numel() * ("A" in parts) + m.lora_B.numel() * ("B" in parts) + ("mix" in parts)
    return int(n)


class StackedMixedLoRALinear(nn.Module):
    r"""``n`` clients' ``MixedLoRALinear`` adapters on one frozen projection, for batched simulation.

    The input's leading dimension holds the clients' rows in order (client c owns rows ``c*b .. (c+1)*b - 1``);
    client c's rows see only client c's adapters and gate:

    $$y_c = W_0 x_c + s\,[\lambda_c B_c A_c x_c + (1 - \lambda_c) B^{ext}_c A^{ext}_c x_c]$$

    Parameters are stacked (``lora_A`` (n, r, in), ``lora_B`` (n, out, r), ``mix_logit`` (n,)); an optimiser's
    element-wise state keeps the clients independent. Used by ``client.BatchedLoRATrainer``.
    """

    def __init__(self, base: nn.Module, n: int, r: int = 4, alpha: float = 8.0, seed: int = 0):
        super().__init__()
        d_in, d_out = _io_features(base)
        self.base, self.n, self.r, self.alpha, self.scaling = base, int(n), int(r), float(alpha), float(alpha) / r
        for p in self.base.parameters():
            p.requires_grad_(False)
        dtype = next(base.parameters()).dtype
        self.lora_A = nn.Parameter(init_lora_A(r, d_in, seed, dtype).repeat(self.n, 1, 1))
        self.lora_B = nn.Parameter(torch.zeros(self.n, d_out, r, dtype=dtype))
        self.register_buffer("ext_A", torch.zeros(self.n, r, d_in, dtype=dtype))
        self.register_buffer("ext_B", torch.zeros(self.n, d_out, r, dtype=dtype))
        self.register_buffer("ext_mask", torch.zeros(self.n, dtype=dtype))
        self.mix_logit = nn.Parameter(torch.zeros(self.n, dtype=dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.base(x)
        shape = x.shape
        xc = x.reshape(self.n, -1, shape[-1])
        clus = torch.bmm(torch.bmm(xc, self.lora_A.transpose(1, 2)), self.lora_B.transpose(1, 2))
        if not bool(self.ext_mask.any()):
            return y + self.scaling * clus.reshape(*shape[:-1], -1)
        lam = (self.ext_mask * torch.sigmoid(self.mix_logit) + (1.0 - self.ext_mask))[:, None, None]
        ext = torch.bmm(torch.bmm(xc, self.ext_A.transpose(1, 2)), self.ext_B.transpose(1, 2))
        return y + self.scaling * (lam * clus + (1.0 - lam) * ext).reshape(*shape[:-1], -1)
