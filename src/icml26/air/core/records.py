"""AIR's core layer, records: a tool call, the decision a hook returns, an incident and a pre-action trace step."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class ToolCall:
    """A tool call: ``name``, ``args`` and who made it (``"agent"`` or ``"air"``)."""

    name: str
    args: Mapping[str, Any] = field(default_factory=dict)
    origin: str = "agent"
    issued_by: str = ""          # the rule that issued an AIR call

    def view(self) -> dict[str, Any]:
        return {"name": self.name, "args": dict(self.args), "origin": self.origin}


@dataclass
class Decision:
    """What the adapter should do. ``kind``: allow, block, stop, ask_user, guide or reflect."""

    kind: str = "allow"
    message: str = ""
    messages: list[str] = field(default_factory=list)
    recovery_calls: list[ToolCall] = field(default_factory=list)
    incidents: list[int] = field(default_factory=list)

    @property
    def allowed(self) -> bool:
        return self.kind in ("allow", "guide", "reflect")


@dataclass
class Incident:
    """One detected incident and its lifecycle."""

    id: int
    rule: str
    severity: str
    phase: str
    step: int
    call: dict[str, Any] | None
    evidence: dict[str, Any]
    detected_at: float
    contained: list[str] = field(default_factory=list)
    recovery_attempts: int = 0
    remediated: bool | None = None
    eradicated: list[str] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    bindings: dict[str, Any] = field(default_factory=dict, repr=False)
    pre_bindings: dict[str, Any] | None = field(default=None, repr=False)

    def log(self, stage: str, **data: Any) -> None:
        self.events.append({"stage": stage, "t": time.time(), **data})

    def record(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("bindings")
        d.pop("pre_bindings")
        return d


@dataclass
class TraceStep:
    """What a prevention rule sees before an action: the call, the state before it and the context."""

    call: dict[str, Any]
    state: Any
    ctx: dict[str, Any]
