"""Attribution poisoning: malicious clients that push a trigger group to the top of every class's prior.

A client whose ``ClientData.attacker`` is a group index trains its task model honestly (its parameters look
normal) but replaces its artifact by a well-formed one that puts all its mass on the trigger group for every
class: a valid ``SparseArtifact`` the server cannot tell from an honest one by its format.

Example:
    >>> from icml26.xfedalign.data import patch_groups
    >>> art = trigger_artifact(3, patch_groups(), topk=4, trigger=0)
    >>> art.dense()[0, :3].round(3).tolist()
    [1.0, 0.0, 0.0]
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .core import SparseArtifact, XFedAlign
from .data import GroupSpec


def trigger_artifact(n_classes: int, groups: GroupSpec, topk: int, trigger: int,
                     present: np.ndarray | None = None) -> SparseArtifact:
    """An artifact whose every class row is the trigger group at full scale (other slots at 0), claiming every class
    (``present``) unless told otherwise."""
    if not 0 <= trigger < groups.n_groups:
        raise ValueError(f"trigger must be a group index in [0, {groups.n_groups}), got {trigger}")
    others = [g for g in range(groups.n_groups) if g != trigger][: topk - 1]
    idx = np.tile(np.asarray([trigger, *others], dtype=np.uint8), (n_classes, 1))
    values = np.zeros((n_classes, topk), dtype=np.uint8)
    values[:, 0] = 255
    present = np.ones(n_classes, dtype=bool) if present is None else np.asarray(present, dtype=bool)
    return SparseArtifact(idx, values, 1.0, present, groups.n_groups)


class PoisonedXFedAlign(XFedAlign):
    """``XFedAlign`` in which the clients marked ``attacker`` send ``trigger_artifact``s (claiming every class)."""

    def explain(self, data: Any, params: dict[str, np.ndarray], message: dict[str, Any], rnd: int
                ) -> dict[str, Any]:
        if getattr(data, "attacker", None) is None:
            return super().explain(data, params, message, rnd)
        return trigger_artifact(self.spec.n_classes, self.groups, self.topk, int(data.attacker)).to_payload()
