"""The optimizers compared in the Shampoo reproduction, each with its learning-rate grid.

Every arm is built on the same parameters; the grids are about (1/3, 1, 3) x each optimizer's usual value
(design notes: "small lr grid per arm"),
four half-decade steps so that no arm's best value sits at an edge of its grid by construction.

Example:
    >>> import torch
    >>> opt = make_optimizer("shampoo_left", [torch.nn.Parameter(torch.zeros(3, 2))], lr=1e-2)
    >>> type(opt).__name__, opt.param_groups[0]["exponents"]
    ('Shampoo', (0.5, 0.0))
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch

from .optimizer import Shampoo

#: the speed options of ``Shampoo`` measured in ``benchmarks/shampoo.py`` against the exact configuration
FAST_OPTIONS: dict = {"statistics_frequency": 10, "root_dtype": torch.float32, "check_finite": False}
#: the exact configuration (the paper's rule: statistics every step, float64 roots, finiteness checked)
EXACT_OPTIONS: dict = {"statistics_frequency": 1, "root_dtype": torch.float64, "check_finite": True}

Factory = Callable[[Iterable[torch.nn.Parameter], float], torch.optim.Optimizer]

FACTORIES: dict[str, Factory] = {
    "adamw": lambda p, lr: torch.optim.AdamW(p, lr=lr, weight_decay=0.0),
    "sgd_momentum": lambda p, lr: torch.optim.SGD(p, lr=lr, momentum=0.9),
    # Shampoo with Adam grafting (the AlgoPerf-winning configuration), roots every 10 steps
    "shampoo_two_sided": lambda p, lr: Shampoo(p, lr=lr, exponents="two_sided", precondition_frequency=10),
    "shampoo_left": lambda p, lr: Shampoo(p, lr=lr, exponents="left", precondition_frequency=10),
    # the fast options (README, speed table): statistics every 10 steps, float32 roots, no finiteness pass
    "shampoo_two_sided_fast": lambda p, lr: Shampoo(
        p, lr=lr, exponents="two_sided", precondition_frequency=10, **FAST_OPTIONS
    ),
    "shampoo_two_sided_exact": lambda p, lr: Shampoo(
        p, lr=lr, exponents="two_sided", precondition_frequency=10, **EXACT_OPTIONS
    ),
    # the paper's pure rule: no grafting (its lr scale is about 10x AdamW's)
    "shampoo_two_sided_nograft": lambda p, lr: Shampoo(
        p, lr=lr, exponents="two_sided", grafting="none", precondition_frequency=10, eps=1e-4
    ),
}

LR_GRIDS: dict[str, tuple[float, ...]] = {
    "adamw": (3e-3, 1e-2, 3e-2, 1e-1),
    "sgd_momentum": (1e-2, 3e-2, 1e-1, 3e-1),
    "shampoo_two_sided": (3e-3, 1e-2, 3e-2, 1e-1),  # Adam grafting: AdamW's scale
    "shampoo_left": (3e-3, 1e-2, 3e-2, 1e-1),
    "shampoo_two_sided_fast": (3e-3, 1e-2, 3e-2, 1e-1),
    "shampoo_two_sided_exact": (3e-3, 1e-2, 3e-2, 1e-1),
    "shampoo_two_sided_nograft": (1e-2, 3e-2, 1e-1, 3e-1),
}


def make_optimizer(arm: str, params: Iterable[torch.nn.Parameter], lr: float) -> torch.optim.Optimizer:
    """Build arm ``arm`` (a key of ``FACTORIES``) on ``params`` with learning rate ``lr``."""
    if arm not in FACTORIES:
        raise ValueError(f"arm must be one of {sorted(FACTORIES)}, got {arm!r}")
    return FACTORIES[arm](params, lr)
