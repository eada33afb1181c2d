"""Client-side training of the adapters: a frozen causal LM with ``MixedLoRALinear`` layers as a label classifier.

A client's prompt ends with ``=``; the model's next-token logits at that position, restricted to the label
tokens (``"0"``, ``"1"``), are the class scores (cross-entropy in training, argmax in evaluation). Only the
adapters (and the gates where an external expert exists) train; the base stays frozen.

``LoRATrainer`` holds one adapted model and loads each client's adapters into it before training, so a
simulation with many clients keeps one copy of the base (what a Ray actor or a real device would hold). Runs
are deterministic: batches are drawn with ``numpy.random.default_rng([seed, client, round])``.

Example:
    >>> from icml26.common.tiny_lm import char_tokenizer, tiny_causal_lm
    >>> tok = char_tokenizer()
    >>> trainer = LoRATrainer(tiny_causal_lm(len(tok), layers=2, hidden=32), tok, r=2, alpha=4)
    >>> sorted(trainer.init_state())[:1]
    ['base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight']
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .module import (
    StackedMixedLoRALinear,
    count_adapter_parameters,
    get_lora_state,
    get_mix_logits,
    inject_mixed_lora,
    layer_index,
    lora_keys,
    lora_modules,
    peft_key,
    set_lora_state,
    trainable_parameters,
)


def label_token_ids(tokenizer: Any, labels: Sequence[str]) -> torch.Tensor:
    """The token id of each label; every label must be one token and the ids distinct (ValueError otherwise)."""
    ids = [tokenizer(lab, add_special_tokens=False)["input_ids"] for lab in labels]
    if any(len(i) != 1 for i in ids) or len({i[0] for i in ids}) != len(ids):
        raise ValueError(f"every label must be one distinct token, got {labels!r} -> {ids}")
    return torch.tensor([i[0] for i in ids])


def proximal_penalty(params: Sequence[torch.Tensor], anchors: Sequence[torch.Tensor], prox: float) -> torch.Tensor:
    r"""Ditto's proximal term: half ``prox`` times the squared distance of the trained factors to an anchor.

    $$\frac{\lambda}{2}\textstyle\sum_k \lVert\theta_k - a_k\rVert_F^2,\qquad
      \nabla_{\theta_k} = \lambda(\theta_k - a_k)$$

    Args:
        params: the trained factors theta_k (tensors; stacked clients' slices in ``BatchedLoRATrainer``).
        anchors: a_k, one tensor of the same shape per entry of ``params``.
        prox: lambda >= 0.

    Returns:
        A scalar tensor, differentiable in ``params``.
    """
    # $$\frac{\lambda}{2}\sum_k \lVert\theta_k - a_k\rVert^2$$  (Ditto, Li et al. 2021, eq. 2)
    return 0.5 * prox * sum(((p - a) ** 2).sum() for p, a in zip(params, anchors, strict=True))


def check_prox(prox: Any, anchor: Mapping[str, np.ndarray] | None, shapes: Mapping[str, tuple[int, ...]],
               name: str = "anchor") -> float:
    """Validate a proximal weight and its anchor; return ``prox`` as a float.

    ``prox`` must be a finite number >= 0; ``prox > 0`` needs ``anchor`` with exactly the keys of ``shapes``,
    each of that shape and finite (``anchor`` is ignored when ``prox == 0``). A ValueError names the argument.

    Args:
        prox: lambda of ``proximal_penalty``.
        anchor: ``{peft key: array}``, the adapters the trained factors are pulled toward.
        shapes: ``{peft key: shape}`` of the trainer's adapters.
        name: how the error messages call ``anchor``.
    """
    if isinstance(prox, bool) or not isinstance(prox, numbers.Real) or not np.isfinite(prox) or prox < 0:
        raise ValueError(f"prox must be a finite number >= 0, got {prox!r}")
    if prox == 0:
        return 0.0
    if anchor is None:
        raise ValueError(f"prox={prox!r} > 0 needs an anchor (the adapters to pull toward), got {name}=None")
    if set(anchor) != set(shapes):
        missing, extra = sorted(set(shapes) - set(anchor))[:3], sorted(set(anchor) - set(shapes))[:3]
        raise ValueError(f"{name}: keys do not match the trainer's adapters (missing {missing}, unexpected {extra})")
    for k, shape in shapes.items():
        value = np.asarray(anchor[k])
        if value.shape != tuple(shape):
            raise ValueError(f"{name}: {k} has shape {value.shape}, the trainer's adapter has {tuple(shape)}")
        if not np.all(np.isfinite(value)):
            raise ValueError(f"{name}: {k} holds NaN or Inf")
    return float(prox)


class LoRATrainer:
    """Local training and evaluation of a client's adapters on a frozen base.

    Args:
        model: a causal LM (``transformers`` ``*ForCausalLM``); adapted in place with ``inject_mixed_lora``.
        tokenizer: its tokenizer (gives the label token ids).
        labels: the label strings, one token each (class i is ``labels[i]``).
        target_modules, r, alpha, init_seed: passed to ``inject_mixed_lora``.
        batch_size: examples per step.
        threads: torch threads while training (1: what a Ray actor with one CPU gets).
    """

    def __init__(self, model: Any, tokenizer: Any, *, labels: Sequence[str] = ("0", "1"),
                 target_modules: Sequence[str] = ("q_proj", "v_proj"), r: int = 4, alpha: float = 8.0,
                 init_seed: int = 0, batch_size: int = 16, threads: int = 1):
        self.label_ids = label_token_ids(tokenizer, labels)
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.tokenizer, self.labels, self.target_modules = tokenizer, tuple(labels), tuple(target_modules)
        self.r, self.alpha, self.init_seed = int(r), float(alpha), int(init_seed)
        self.model_path: str | None = None
        """the directory the base was loaded from (``from_pretrained``); the Flower App's clients load it there"""
        self.model = inject_mixed_lora(model, target_modules, r=r, alpha=alpha, seed=init_seed).eval()
        self.keys = lora_keys(self.model)
        self.layers = sorted({layer_index(k) for k in self.keys})
        self.batch_size, self.threads = int(batch_size), int(threads)
        self._init = get_lora_state(self.model, "clus")

    @classmethod
    def from_pretrained(cls, path: str | Path, **kwargs: Any) -> LoRATrainer:
        """A trainer over the causal LM and tokenizer saved in ``path`` (``save_pretrained``; never the hub).

        The base is frozen and uses eager attention (as the reproduction); ``kwargs`` as ``LoRATrainer``'s.
        ``model_path`` remembers ``path`` (the Flower App's clients load the same base from it).
        """
        from ..common.tiny_lm import load_lab_model

        model, tokenizer = load_lab_model(path)
        if hasattr(model, "set_attn_implementation"):
            model.set_attn_implementation("eager")
        for p in model.parameters():
            p.requires_grad_(False)
        trainer = cls(model.eval(), tokenizer, **kwargs)
        trainer.model_path = str(Path(path).resolve())
        return trainer

    def init_state(self) -> dict[str, np.ndarray]:
        """The shared initial adapters (A from the seeded init, B = 0), under peft key names."""
        return {k: v.copy() for k, v in self._init.items()}

    def n_parameters(self, parts: Sequence[str] = ("A", "B")) -> int:
        """Adapter parameters of one client (``parts`` among ``"A"``, ``"B"``, ``"mix"``)."""
        return count_adapter_parameters(self.model, parts)

    def _scores(self, ids: torch.Tensor) -> torch.Tensor:
        logits = self.model(input_ids=ids, logits_to_keep=1).logits[:, -1, :]
        return logits[:, self.label_ids]

    def train(self, data: tuple[np.ndarray, np.ndarray], clus: Mapping[str, np.ndarray],
              ext: Mapping[str, np.ndarray] | None, mix_logits: Mapping[str, float] | None, *, steps: int,
              lr: float, seed: Sequence[int], train_A: bool = True, train_B: bool = True,
              gate_lr: float | None = None, prox: float = 0.0, anchor: Mapping[str, np.ndarray] | None = None
              ) -> tuple[dict[str, np.ndarray], dict[str, float]]:
        r"""``steps`` AdamW steps on the cluster experts (and gates) from ``clus`` / ``ext`` / ``mix_logits``.

        $$\mathcal L = \mathrm{CE} + \frac{\lambda}{2}\textstyle\sum_k \lVert\theta_k - a_k\rVert^2$$
        (the second term only when ``prox`` = lambda > 0; theta_k: the trained factors, A and/or B)

        Args:
            gate_lr: the gates' learning rate (default ``lr``).
            prox: lambda >= 0 of the proximal term (``proximal_penalty``; Ditto's personal pass).
            anchor: a_k, ``{peft key: array}`` with every key of ``init_state()``; needed when ``prox > 0``.

        Returns:
            The trained cluster experts (peft key names) and the gate logits.
        """
        if len(data[1]) == 0:
            raise ValueError("a client with no training data cannot train")
        if steps < 0 or not (lr > 0 and np.isfinite(lr)):
            raise ValueError(f"need steps >= 0 and a positive finite lr, got {steps}, {lr}")
        prox = check_prox(prox, anchor, {k: v.shape for k, v in self._init.items()})
        before = torch.get_num_threads()
        torch.set_num_threads(self.threads)
        try:
            set_lora_state(self.model, clus, ext, mix_logits)
            params = trainable_parameters(self.model, train_A=train_A, train_B=train_B)
            gates = [m.mix_logit for m in lora_modules(self.model).values() if m.mix_logit.requires_grad]
            factors = [p for p in params if all(p is not g for g in gates)]
            groups = [{"params": factors, "lr": lr}] if factors else []
            if gates:
                groups.append({"params": gates, "lr": lr if gate_lr is None else gate_lr})
            x_all, y_all = torch.from_numpy(np.asarray(data[0])), torch.from_numpy(np.asarray(data[1]))
            rng = np.random.default_rng(list(seed))
            pulled, anchors = [], []      # the trained factors theta_k and their anchors a_k (prox > 0 only)
            if prox > 0:
                for name, m in lora_modules(self.model).items():
                    for f, p in (("A", m.lora_A), ("B", m.lora_B)):
                        if p.requires_grad:
                            pulled.append(p)
                            anchors.append(torch.tensor(np.asarray(anchor[peft_key(name, f)]), dtype=p.dtype))
            if params and steps:
                opt = torch.optim.AdamW(groups, lr=lr, weight_decay=0.0)
                self.model.train()
                for _ in range(steps):
                    idx = torch.from_numpy(rng.integers(0, len(y_all), size=min(self.batch_size, len(y_all))))
                    loss = torch.nn.functional.cross_entropy(self._scores(x_all[idx]), y_all[idx])
                    if pulled:
                        # $$\mathcal L = \mathrm{CE} + \frac{\lambda}{2}\sum_k \lVert\theta_k - a_k\rVert^2$$
                        loss = loss + proximal_penalty(pulled, anchors, prox)
                    if not torch.isfinite(loss):
                        raise FloatingPointError(f"local loss is {float(loss)}")
                    opt.zero_grad(set_to_none=True)
                    loss.backward()
                    opt.step()
                self.model.eval()
            for m in lora_modules(self.model).values():
                m.lora_A.requires_grad_(False)
                m.lora_B.requires_grad_(False)
                m.mix_logit.requires_grad_(False)
            return get_lora_state(self.model, "clus"), get_mix_logits(self.model)
        finally:
            torch.set_num_threads(before)

    @torch.no_grad()
    def correct(self, data: tuple[np.ndarray, np.ndarray], clus: Mapping[str, np.ndarray],
                ext: Mapping[str, np.ndarray] | None = None, mix_logits: Mapping[str, float] | None = None,
                batch: int = 256) -> np.ndarray:
        """Per-item correctness (0/1 floats, in data order) of the model with these adapters."""
        if len(data[1]) == 0:
            return np.zeros(0, dtype=np.float64)
        set_lora_state(self.model, clus, ext, mix_logits)
        self.model.eval()
        x, y = torch.from_numpy(np.asarray(data[0])), np.asarray(data[1])
        pred = torch.cat([self._scores(x[i:i + batch]).argmax(-1) for i in range(0, len(x), batch)]).numpy()
        return (pred == y).astype(np.float64)

    @torch.no_grad()
    def base_correct(self, data: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
        """Per-item correctness of the frozen base alone (zero adapters)."""
        zero = {k: np.zeros_like(v) for k, v in self._init.items()}
        return self.correct(data, zero)


class BatchedLoRATrainer:
    """``LoRATrainer`` for ``n`` clients at once: one forward pass over all clients' batches.

    Each client's adapters, gates and optimiser state are slices of stacked tensors, so client c's update
    depends only on its own batch (the loss is the sum of the clients' mean losses): the same training as ``n``
    separate ``LoRATrainer`` runs up to float summation order. Built from the same base model (deep-copied)
    and initialisation seeds, so ``init_state()`` equals ``LoRATrainer``'s. Clients must have equal batch sizes.
    """

    def __init__(self, model: Any, tokenizer: Any, n_clients: int, *, labels: Sequence[str] = ("0", "1"),
                 target_modules: Sequence[str] = ("q_proj", "v_proj"), r: int = 4, alpha: float = 8.0,
                 init_seed: int = 0, batch_size: int = 16, threads: int = 1):
        import copy

        self.label_ids = label_token_ids(tokenizer, labels)
        if n_clients < 1:
            raise ValueError(f"n_clients must be >= 1, got {n_clients}")
        self.n, self.batch_size, self.threads = int(n_clients), int(batch_size), int(threads)
        self.model = copy.deepcopy(model)
        for p in self.model.parameters():
            p.requires_grad_(False)
        names = [n for n, m in self.model.named_modules() if n and n.rsplit(".", 1)[-1] in set(target_modules)]
        if not names:
            raise ValueError(f"no module matches target_modules={list(target_modules)}")
        self.modules: dict[str, StackedMixedLoRALinear] = {}
        for i, name in enumerate(names):
            parent_name, _, child = name.rpartition(".")
            parent = self.model.get_submodule(parent_name) if parent_name else self.model
            layer = StackedMixedLoRALinear(getattr(parent, child), self.n, r=r, alpha=alpha, seed=init_seed + i)
            setattr(parent, child, layer)
            self.modules[name] = layer
        self.model.eval()
        self.keys = [peft_key(name, f) for name in self.modules for f in ("A", "B")]
        self.layers = sorted({layer_index(k) for k in self.keys})
        self._init = {peft_key(name, f): (m.lora_A[0] if f == "A" else m.lora_B[0]).detach().numpy().copy()
                      for name, m in self.modules.items() for f in ("A", "B")}

    def init_state(self) -> dict[str, np.ndarray]:
        """The shared initial adapters (the same as ``LoRATrainer.init_state()`` for the same base and seed)."""
        return {k: v.copy() for k, v in self._init.items()}

    def _load(self, inputs: Sequence[tuple[Mapping[str, np.ndarray], Mapping[str, np.ndarray], Mapping[str, float]]]
              ) -> None:
        if len(inputs) != self.n:
            raise ValueError(f"{len(inputs)} clients for a trainer of {self.n}")
        with torch.no_grad():
            for name, m in self.modules.items():
                ka, kb = peft_key(name, "A"), peft_key(name, "B")
                m.lora_A.copy_(torch.from_numpy(np.stack([np.asarray(c[ka], dtype=np.float32) for c, _, _ in inputs])))
                m.lora_B.copy_(torch.from_numpy(np.stack([np.asarray(c[kb], dtype=np.float32) for c, _, _ in inputs])))
                mask = [ka in e for _, e, _ in inputs]
                m.ext_mask.copy_(torch.tensor(mask, dtype=m.ext_mask.dtype))
                m.ext_A.zero_()
                m.ext_B.zero_()
                for c, (_, e, _) in enumerate(inputs):
                    if ka in e:
                        m.ext_A[c] = torch.from_numpy(np.asarray(e[ka], dtype=np.float32))
                        m.ext_B[c] = torch.from_numpy(np.asarray(e[kb], dtype=np.float32))
                m.mix_logit.copy_(torch.tensor([float(mix.get(name, 0.0)) for _, _, mix in inputs]))

    def _scores(self, ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=ids, logits_to_keep=1).logits[:, -1, :][:, self.label_ids]

    def train_many(self, datas: Sequence[tuple[np.ndarray, np.ndarray]], inputs: Sequence[tuple[Any, Any, Any]],
                   kwargs: Sequence[Mapping[str, Any]]) -> list[tuple[dict[str, np.ndarray], dict[str, float]]]:
        r"""Every client's ``LoRATrainer.train`` at once; ``kwargs[c]`` as ``train``'s (equal but for the seed
        and the anchor).

        The loss is the sum of the clients' losses, each with its own proximal term when ``prox`` > 0:

        $$\mathcal L = \textstyle\sum_c \big(\mathrm{CE}_c + \frac{\lambda}{2}\sum_k
          \lVert\theta_{c,k} - a_{c,k}\rVert^2\big)$$

        Args:
            datas: every client's training split.
            inputs: every client's ``(clus, ext, mix_logits)``.
            kwargs: every client's ``train`` kwargs; ``prox`` must be equal across clients, ``anchor`` (client
                c's a_c) and ``seed`` are per client.

        Returns:
            Per client, the trained cluster experts and the gate logits.
        """
        per_client = ("seed", "anchor")
        shared = {k: v for k, v in kwargs[0].items() if k not in per_client}
        if any({k: v for k, v in kw.items() if k not in per_client} != shared for kw in kwargs):
            raise ValueError("batched clients must share steps, lr, gate_lr, prox and trainable factors")
        if len(kwargs) != self.n:
            raise ValueError(f"{len(kwargs)} clients' kwargs for a trainer of {self.n}")
        shapes = {k: v.shape for k, v in self._init.items()}
        prox = 0.0
        for c, kw in enumerate(kwargs):
            prox = check_prox(shared.get("prox", 0.0), kw.get("anchor"), shapes, name=f"client {c}'s anchor")
        anchors = [kw.get("anchor") for kw in kwargs]
        sizes = {min(self.batch_size, len(d[1])) for d in datas}
        if len(sizes) != 1 or 0 in sizes:
            raise ValueError(f"batched clients need equal, non-zero batch sizes, got {sorted(sizes)}")
        bsz = sizes.pop()
        before = torch.get_num_threads()
        torch.set_num_threads(self.threads)
        try:
            self._load(inputs)
            params, gates = [], []
            for m in self.modules.values():
                m.lora_A.requires_grad_(bool(shared["train_A"]))
                m.lora_B.requires_grad_(bool(shared["train_B"]))
                has_ext = bool(m.ext_mask.any())
                m.mix_logit.requires_grad_(has_ext)
                params += [p for p in (m.lora_A, m.lora_B) if p.requires_grad]
                gates += [m.mix_logit] if has_ext else []
            gate_lr = shared["lr"] if shared.get("gate_lr") is None else shared["gate_lr"]
            groups = ([{"params": params, "lr": shared["lr"]}] if params else []) + (
                [{"params": gates, "lr": gate_lr}] if gates else [])
            xs = [torch.from_numpy(np.asarray(d[0])) for d in datas]
            ys = [torch.from_numpy(np.asarray(d[1])) for d in datas]
            rngs = [np.random.default_rng(list(kw["seed"])) for kw in kwargs]
            pulled, stacked = [], []      # the trained stacked factors and every client's anchor, stacked alike
            if prox > 0:
                for name, m in self.modules.items():
                    for f, p in (("A", m.lora_A), ("B", m.lora_B)):
                        if p.requires_grad:
                            key = peft_key(name, f)
                            pulled.append(p)
                            stacked.append(torch.from_numpy(np.stack(
                                [np.asarray(anchors[c][key], dtype=np.float32) for c in range(self.n)])))
            if groups and shared["steps"]:
                opt = torch.optim.AdamW(groups, lr=shared["lr"], weight_decay=0.0)
                self.model.train()
                for _ in range(shared["steps"]):
                    idx = [torch.from_numpy(g.integers(0, len(y), size=bsz)) for g, y in zip(rngs, ys, strict=True)]
                    x = torch.cat([xc[i] for xc, i in zip(xs, idx, strict=True)])
                    y = torch.cat([yc[i] for yc, i in zip(ys, idx, strict=True)])
                    per = torch.nn.functional.cross_entropy(self._scores(x), y, reduction="none")
                    loss = per.reshape(self.n, bsz).mean(1).sum()
                    if pulled:
                        # $$\sum_c \frac{\lambda}{2}\sum_k \lVert\theta_{c,k} - a_{c,k}\rVert^2$$: slice c sees only a_c
                        loss = loss + proximal_penalty(pulled, stacked, prox)
                    if not torch.isfinite(loss):
                        raise FloatingPointError(f"local loss is {float(loss)}")
                    opt.zero_grad(set_to_none=True)
                    loss.backward()
                    opt.step()
                self.model.eval()
            out = []
            for c in range(self.n):
                weights, mix = {}, {}
                for name, m in self.modules.items():
                    weights[peft_key(name, "A")] = m.lora_A[c].detach().numpy().astype(np.float32, copy=True)
                    weights[peft_key(name, "B")] = m.lora_B[c].detach().numpy().astype(np.float32, copy=True)
                    mix[name] = float(m.mix_logit[c].detach())
                out.append((weights, mix))
            return out
        finally:
            for m in self.modules.values():
                for p in (m.lora_A, m.lora_B, m.mix_logit):
                    p.requires_grad_(False)
            torch.set_num_threads(before)

    @torch.no_grad()
    def correct_many(self, datas: Sequence[tuple[np.ndarray, np.ndarray]], inputs: Sequence[tuple[Any, Any, Any]],
                     chunk: int = 64) -> list[np.ndarray]:
        """Every client's per-item correctness with its adapters (clients need equally many items)."""
        sizes = {len(d[1]) for d in datas}
        if len(sizes) != 1:
            raise ValueError(f"batched evaluation needs equally many items per client, got {sorted(sizes)}")
        n_items = sizes.pop()
        self._load(inputs)
        self.model.eval()
        xs = [torch.from_numpy(np.asarray(d[0])) for d in datas]
        preds = []
        for i in range(0, n_items, chunk):
            x = torch.cat([xc[i:i + chunk] for xc in xs])
            preds.append(self._scores(x).argmax(-1).reshape(self.n, -1))
        pred = torch.cat(preds, dim=1).numpy()
        return [(pred[c] == np.asarray(d[1])).astype(np.float64) for c, d in enumerate(datas)]
