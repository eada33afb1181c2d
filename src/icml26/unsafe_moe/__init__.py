"""Unsafe routes in mixture-of-experts LLMs: route control, RoSais, F-SOUR, judges and route disabling.

Needs the ``hf`` extra (``pip install 'icml26[hf]'``). See ``README.md`` in this folder.
"""

from .attack import (
    FSOUR,
    RoSaisResult,
    RouteAttack,
    best_within,
    chat_text,
    random_route_search,
    rosais,
    route_disabling_bans,
)
from .judge import LLMJudge, RuleJudge, TieredJudge
from .routing import RouteDropout, RouterController, RouterInfo, disable_routes, find_routers, route

__all__ = [
    "FSOUR",
    "LLMJudge",
    "RoSaisResult",
    "RouteAttack",
    "RouteDropout",
    "RouterController",
    "RouterInfo",
    "RuleJudge",
    "TieredJudge",
    "best_within",
    "chat_text",
    "disable_routes",
    "find_routers",
    "random_route_search",
    "rosais",
    "route",
    "route_disabling_bans",
]
