"""AIR's core layer, records: a tool call, the decision a hook returns, an incident and a pre-action trace step;
and the safe serialisation of the values they hold (:func:`plain`, :func:`safe_json`, :func:`safe_str`)."""

from __future__ import annotations

import json
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
        try:
            d = asdict(self)              # deep-copies the evidence, which holds the agent's values
        except Exception:                 # a value that cannot be copied: its JSON-safe form (plain)
            d = {k: plain(v) for k, v in vars(self).items()}
        d.pop("bindings")
        d.pop("pre_bindings")
        return d


@dataclass
class TraceStep:
    """What a prevention rule sees before an action: the call, the state before it and the context."""

    call: dict[str, Any]
    state: Any
    ctx: dict[str, Any]


MAX_PLAIN_DEPTH = 200            # plain() writes deeper values as a placeholder (the hooks refuse nesting over 64)


def safe_str(value: Any) -> str:
    """``str(value)``, or a placeholder naming its type when that raises (a hostile ``__str__``, an integer past
    Python's int-to-str digit limit).

    Example:
        >>> safe_str(10 ** 5000)
        '<int of about 5000 digits>'
    """
    if isinstance(value, int) and not isinstance(value, bool):
        return _int_text(value)
    try:
        out = str(value)
    except Exception:
        return f"<unprintable {type(value).__name__}>"
    return out if isinstance(out, str) else f"<unprintable {type(value).__name__}>"


def _int_text(n: int) -> str:
    try:
        return str(int(n))
    except ValueError:            # past sys.get_int_max_str_digits(): its size, not its digits
        return f"<int of about {round(int(n).bit_length() * 0.30103)} digits>"


def plain(value: Any) -> Any:
    """A JSON-safe copy of ``value``: what ``json.loads(json.dumps(value, default=str))`` gives, made without raising.

    Mappings become dicts with string keys, lists and tuples lists, other objects their :func:`safe_str`; an
    integer longer than Python's int-to-str limit, an object whose ``__str__`` raises, a key JSON cannot write
    (a tuple) or a value nested deeper than ``MAX_PLAIN_DEPTH`` becomes a placeholder string instead of an error.

    Example:
        >>> plain({"n": 10 ** 5000, (1, 2): {3}, "ok": [1.5, None]})
        {'n': '<int of about 5000 digits>', '(1, 2)': '{3}', 'ok': [1.5, None]}
    """
    try:
        return json.loads(json.dumps(value, default=str))
    except Exception:             # ValueError (a long int), a raising __str__, a bad key, RecursionError
        return _plain(value, 0)


def _plain(v: Any, depth: int) -> Any:
    if v is None or isinstance(v, bool | str | float):
        return str(v) if isinstance(v, str) and type(v) is not str else v
    if isinstance(v, int):
        text = _int_text(v)
        return int(text) if text[:1] != "<" else text
    if depth >= MAX_PLAIN_DEPTH:
        return f"<{type(v).__name__} nested deeper than {MAX_PLAIN_DEPTH}>"
    try:
        if isinstance(v, Mapping):
            return {_key(k): _plain(c, depth + 1) for k, c in v.items()}
        if isinstance(v, list | tuple):
            return [_plain(c, depth + 1) for c in v]
    except Exception:             # a container whose iteration raises
        return f"<unreadable {type(v).__name__}>"
    return safe_str(v)


def _key(k: Any) -> str:
    if isinstance(k, str):
        return str(k)
    if k is None or isinstance(k, bool):
        return json.dumps(k)
    if isinstance(k, float):
        return json.dumps(k)
    return safe_str(k)


def safe_json(value: Any, **kwargs: Any) -> str:
    """``json.dumps(value, default=str, **kwargs)``, or the dump of :func:`plain` (value) when that raises.

    Example:
        >>> safe_json([10 ** 5000])
        '["<int of about 5000 digits>"]'
    """
    try:
        return json.dumps(value, default=str, **kwargs)
    except Exception:
        return json.dumps(plain(value), **kwargs)
