"""AdamW-style Shampoo optimizer (one- and two-sided preconditioning).

Paper: "Convergence Rate Analysis of the AdamW-style Shampoo: Unifying One-sided and Two-Sided
Preconditioning", Huan Li, Yiming Dong, Zhouchen Lin, ICML 2026. https://arxiv.org/abs/2601.07326

Shampoo keeps an EMA of gradients and two EMA Kronecker factors L = E[G G^T], R = E[G^T G] per matrix parameter,
and steps along L^(-1/(2p)) M R^(-1/(2q)) with 1/p + 1/q = 1 and AdamW's decoupled weight decay. The paper
proves (1/K) sum_k E||grad f(X_k)||_* <= O(sqrt(m+n) C / K^(1/4)) for one- and two-sided preconditioning.

``Shampoo`` is a drop-in ``torch.optim.Optimizer`` with Adam grafting, amortised eigendecomposition or coupled
Newton roots, blocking of large dimensions, speed options (statistics every s steps, float32 roots with a
float64 retry, an optional finiteness pass, one-sided on the smaller side), every block of a shape updated,
rooted and applied in batched calls with no host read outside root computations, and a pure update function
``shampoo_update``; its state saves and reloads through ``torch.distributed.checkpoint``. Not implemented:
Meta's distributed sharding of the state and root work (DDP works by all-reducing gradients, every rank holding
the full state; no FSDP/DTensor parameters), eigenvalue-corrected variants (SOAP), iterate averaging,
``torch.compile``. The exact update rule is reconstructed (see README).

Example:
    >>> import torch, icml26.shampoo as S
    >>> opt = S.Shampoo(torch.nn.Linear(4, 2).parameters(), lr=1e-3)
    >>> type(opt).__mro__[1].__name__
    'Optimizer'
"""

from .optimizer import Shampoo, matrix_inverse_root, resolve_exponents, shampoo_update

__all__ = ["Shampoo", "matrix_inverse_root", "resolve_exponents", "shampoo_update"]
