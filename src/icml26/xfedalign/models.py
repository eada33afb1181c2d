"""Task models (torch) and the pieces of FedAvg every arm shares: local SGD and the weighted average.

Parameters travel as ``{name: float32 array}`` dicts (the model's ``state_dict`` names), the form Flower's
``ArrayRecord`` carries; ``fedavg`` averages them exactly as ``flwr.serverapp.strategy.FedAvg`` does (weights
n_i / sum n, accumulated in float32 in client order), so a Flower run and the in-process runner agree bit for bit.

Example:
    >>> import numpy as np
    >>> model = task_model(64, 10, hidden=16, seed=0)
    >>> params = get_params(model)
    >>> X = np.random.default_rng(0).random((40, 64)).astype(np.float32)
    >>> y = np.arange(40) % 10
    >>> new = local_sgd(params, X, y, spec=ModelSpec(64, 10, 16), lr=0.1, epochs=1, seed=1)
    >>> sorted(new) == sorted(params), fedavg([params, new], [1, 1])["0.bias"].dtype
    (True, dtype('float32'))
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

Params = dict[str, np.ndarray]


@dataclass(frozen=True)
class ModelSpec:
    """A task model: an MLP d -> hidden -> C (ReLU), or a linear model when ``hidden`` is 0."""

    n_features: int
    n_classes: int
    hidden: int = 64


def build(spec: ModelSpec) -> nn.Module:
    """The torch module for ``spec`` (float32)."""
    if spec.hidden == 0:
        return nn.Sequential(nn.Linear(spec.n_features, spec.n_classes))
    return nn.Sequential(nn.Linear(spec.n_features, spec.hidden), nn.ReLU(), nn.Linear(spec.hidden, spec.n_classes))


def task_model(n_features: int, n_classes: int, *, hidden: int = 64, seed: int = 0) -> nn.Module:
    """A freshly initialised task model (torch's default init under ``torch.manual_seed(seed)``)."""
    gen_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        return build(ModelSpec(n_features, n_classes, hidden))
    finally:
        torch.random.set_rng_state(gen_state)


def get_params(model: nn.Module) -> Params:
    return {k: v.detach().cpu().numpy().astype(np.float32).copy() for k, v in model.state_dict().items()}


def load(spec: ModelSpec, params: Params) -> nn.Module:
    """A module of ``spec`` holding ``params``."""
    model = build(spec)
    model.load_state_dict({k: torch.from_numpy(np.asarray(v, dtype=np.float32).copy()) for k, v in params.items()})
    return model.eval()


def predict_logits(spec: ModelSpec, params: Params, X: np.ndarray) -> np.ndarray:
    """The model's logits on X (float32 arithmetic, returned as float64), without building the module."""
    z = np.asarray(X, dtype=np.float32) @ params["0.weight"].T + params["0.bias"]
    if spec.hidden:
        z = np.maximum(z, 0) @ params["2.weight"].T + params["2.bias"]
    return z.astype(np.float64)


def minibatches(n: int, *, epochs: int, batch_size: int, seed: int) -> list[np.ndarray]:
    """The index batches of ``epochs`` shuffled passes over ``range(n)`` (NumPy PCG64 from ``seed``)."""
    rng = np.random.default_rng(int(seed))
    out = []
    for _ in range(epochs):
        perm = rng.permutation(n)
        out.extend(perm[start:start + batch_size] for start in range(0, n, batch_size))
    return out


def local_sgd(params: Params, X: np.ndarray, y: np.ndarray, *, spec: ModelSpec, lr: float, epochs: int = 1,
              batch_size: int = 32, momentum: float = 0.9, l1: float = 0.0, seed: int = 0) -> Params:
    """Local training from ``params``: SGD with momentum on cross-entropy (+ l1 ||W||_1 on weight matrices).

    The update of ``torch.optim.SGD(momentum=momentum)`` on ``nn.functional.cross_entropy`` through autograd
    (``local_sgd_autograd``, the tests' reference, agrees to float32 rounding), with the backward pass of the
    one- or two-layer model written out in float32 NumPy: many times faster on these small models. Batches come
    from ``minibatches(seed)``; momentum starts at zero on every call (a client keeps no optimiser state).
    """
    if len(X) == 0:
        raise ValueError("a client needs at least one training sample")
    X = np.asarray(X, dtype=np.float32)
    y = np.asarray(y, dtype=np.int64)
    P = {k: np.array(v, dtype=np.float32) for k, v in params.items()}
    names = ["0.weight", "0.bias"] + (["2.weight", "2.bias"] if spec.hidden else [])
    if sorted(P) != sorted(names):
        raise ValueError(f"params {sorted(P)} do not fit the model {spec}")
    buf = {k: np.zeros_like(P[k]) for k in names}
    lr32, mom32, l132 = np.float32(lr), np.float32(momentum), np.float32(l1)
    for idx in minibatches(len(X), epochs=epochs, batch_size=batch_size, seed=seed):
        xb = X[idx]
        z1 = xb @ P["0.weight"].T + P["0.bias"]
        if spec.hidden:
            a1 = np.maximum(z1, 0)
            logits = a1 @ P["2.weight"].T + P["2.bias"]
        else:
            logits = z1
        # d CE / d logits = (softmax - onehot) / B
        g = np.exp(logits - logits.max(axis=1, keepdims=True))
        g /= g.sum(axis=1, keepdims=True)
        g[np.arange(len(idx)), y[idx]] -= 1
        g /= np.float32(len(idx))
        grads = {}
        if spec.hidden:
            grads["2.weight"], grads["2.bias"] = g.T @ a1, g.sum(0)
            g = (g @ P["2.weight"]) * (z1 > 0)
        grads["0.weight"], grads["0.bias"] = g.T @ xb, g.sum(0)
        for k in names:
            grad = grads[k]
            if l1 > 0 and k.endswith("weight"):
                grad = grad + l132 * np.sign(P[k])
            # torch.optim.SGD: buf <- momentum * buf + grad;  theta <- theta - lr * buf
            buf[k] *= mom32
            buf[k] += grad
            P[k] -= lr32 * buf[k]
    return P


def local_sgd_autograd(params: Params, X: np.ndarray, y: np.ndarray, *, spec: ModelSpec, lr: float,
                       epochs: int = 1, batch_size: int = 32, momentum: float = 0.9, l1: float = 0.0,
                       seed: int = 0) -> Params:
    """``local_sgd`` through ``nn.Module``, autograd and ``torch.optim.SGD`` (the reference of the tests)."""
    model = load(spec, params).train()
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
    Xt, yt = torch.as_tensor(np.asarray(X, dtype=np.float32)), torch.as_tensor(np.asarray(y, dtype=np.int64))
    weights = [p for name, p in model.named_parameters() if name.endswith("weight")]
    for idx in minibatches(len(Xt), epochs=epochs, batch_size=batch_size, seed=seed):
        idx = torch.as_tensor(idx)
        loss = nn.functional.cross_entropy(model(Xt[idx]), yt[idx])
        if l1 > 0:
            loss = loss + l1 * sum(w.abs().sum() for w in weights)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return get_params(model)


def fedavg(params: Sequence[Params], weights: Sequence[float]) -> Params:
    r"""Weighted average $$\theta = \sum_i \frac{n_i}{\sum_j n_j}\,\theta_i$$, in the order given.

    The same arithmetic as Flower's ``aggregate_arrayrecords`` (float32 arrays times Python-float factors).
    """
    if len(params) == 0 or len(params) != len(weights):
        raise ValueError(f"need one weight per client and at least one client, got {len(params)} and {len(weights)}")
    keys = set(params[0])
    if any(set(p) != keys for p in params):
        raise ValueError("clients sent different parameter names (mismatched models)")
    total = sum(float(w) for w in weights)
    if total <= 0:
        raise ValueError("the weights (client sample counts) must sum to a positive number")
    out: Params = {}
    for p, w in zip(params, weights, strict=True):
        factor = float(w) / total
        for k, v in p.items():
            if k not in out:
                out[k] = v * factor
            else:
                out[k] += v * factor
    return out


def accuracy_items(spec: ModelSpec, params: Params, X: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Per-item 0/1 correctness."""
    return (predict_logits(spec, params, X).argmax(1) == np.asarray(y)).astype(float)
