"""A slow, literal oracle for AIR's state diff (tests only; no experiment imports this module, and it imports no
part of AIR, so it sits outside AIR's import graph).

AIR's evidence for an incident is the change of the environment's state across a step, ``diff(before, after)``:
every leaf path whose value differs, with the two values. ``runtime.state.diff`` skips equal mappings in one C-level
comparison; this is the plain recursive walk it replaced (issue #36 item 7), which visits every key:

    diff(b, a, p) = []                                                       if b is a
                  = concat_{k in keys(b) | keys(a), sorted by str} diff(b.get(k), a.get(k), p.k)   if both dicts
                  = [] if b == a else [{"path": p, "before": b, "after": a}]                      otherwise

(a missing key reads as None). Reference: ``diff`` (then in ``responder.py``) before issue #36 item 7 (the
recursion is this library's, not an equation of the AIR paper, Xiao, Sun & Chen 2026, arXiv:2602.11749).

Example:
    >>> slow_diff({"a": 1, "b": {"c": 2}}, {"a": 1, "b": {"c": 3}})
    [{'path': 'b.c', 'before': 2, 'after': 3}]
"""

from __future__ import annotations

from typing import Any


def slow_diff(before: Any, after: Any, path: str = "") -> list[dict[str, Any]]:
    """``diff`` as it was: the identity shortcut, then a walk of every dict (no equal-mapping shortcut).

    $$\\mathrm{diff}(b, a) = \\{(p, b_p, a_p) : p \\text{ a leaf path of } b \\text{ or } a,\\ b_p \\ne a_p\\}$$
    listed depth first with the keys of each mapping in ``str`` order.
    """
    if before is after:
        return []
    if isinstance(before, dict) and isinstance(after, dict):
        out: list[dict[str, Any]] = []
        for k in sorted(set(before) | set(after), key=str):
            out += slow_diff(before.get(k), after.get(k), f"{path}.{k}" if path else str(k))
        return out
    return [] if before == after else [{"path": path, "before": before, "after": after}]
