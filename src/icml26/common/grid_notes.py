"""The note a result carries when a tuned learning rate is still on an edge of its bracketed grid.

:func:`~icml26.common.bracketing.tune_bracketed` records whether each choice is still on an edge after its
extensions (``at_edge``); a paper puts this note on its headline claim so the reader sees which arms' rates are not
bracketed (issue #53 item 1: "when the choice lands on an edge, extend the grid and say so in the result
automatically").

Example:
    >>> lr_edge_note(1, {"moda": {"lr": 0.032, "grid": [0.002, 0.032], "at_edge": True},
    ...                  "none": {"lr": 0.004, "grid": [0.002, 0.004, 0.008], "at_edge": False}})
    'learning rate on the edge of its grid after 1 extension(s) for moda (0.032 of [0.002, 0.032])'
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["lr_edge_note"]


def lr_edge_note(lr_extend: int, choice: Mapping[str, Mapping[str, Any]]) -> str | None:
    """The note naming every arm whose chosen learning rate is still on an edge of its grid, or ``None``.

    Args:
        lr_extend: how many values the grid could be extended by past an edge (stated in the note).
        choice: ``{arm: {"lr": chosen rate, "grid": the rates scored, "at_edge": bool}}``.
    Returns:
        ``"learning rate on the edge of its grid after K extension(s) for arm (lr of [grid]), ..."``, or ``None``
        when no choice is on an edge.
    """
    edge = [name for name, t in choice.items() if t["at_edge"]]
    if not edge:
        return None
    return (f"learning rate on the edge of its grid after {lr_extend} extension(s) for "
            + ", ".join(f"{n} ({choice[n]['lr']:g} of {[float(f'{v:.3g}') for v in choice[n]['grid']]})"
                        for n in edge))
