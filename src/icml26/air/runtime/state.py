"""AIR's runtime layer, state views: the state providers, deferred snapshots and the state diff."""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from typing import Any, Protocol


class StateProvider(Protocol):
    """The environment's state as AIR sees it."""

    def view(self) -> Mapping[str, Any]: ...

    def snapshot(self) -> Mapping[str, Any]: ...


class DictState:
    """A state provider over a function returning a JSON-like mapping; snapshots are deep copies.

    Args:
        getter: returns the state.
        fresh: the getter builds a new structure on every call (e.g. a ``model_dump``), so a snapshot is the
            getter's result as is, with no deep copy.
        cache: (implies ``fresh``) the state changes only through the tool calls AIR sees (the agent's calls and
            AIR's own recovery calls): the view is built once and the same structure is reused, as view and as
            snapshot, until :meth:`invalidate`, which the responder calls whenever a call has run
            (``after_action``, each recovery call, ``begin``). Copy-on-write: a state no call has changed since
            the last hook costs nothing, and one ``model_dump`` per tool call serves the post-call rules, the
            state-change check and the next call's pre-action snapshot (issue #36 item 7). Not for states with
            dynamics of their own between calls (those need ``cache=False``).

    Example:
        >>> reads = []
        >>> st = DictState(lambda: reads.append(1) or {"n": len(reads)}, cache=True)
        >>> st.view() is st.snapshot(), len(reads)
        (True, 1)
        >>> st.invalidate(); st.view()["n"]
        2
    """

    def __init__(self, getter: Callable[[], Mapping[str, Any]], *, fresh: bool = False, cache: bool = False):
        self.getter, self.fresh, self.cache = getter, fresh or cache, cache
        self._cached: Mapping[str, Any] | None = None
        self._deferred: DeferredView | None = None

    def view(self) -> Mapping[str, Any]:
        if not self.cache:
            return self.getter()
        if self._cached is None:
            d = self._deferred
            self._cached = d.value() if d is not None else self.getter()
        return self._cached

    def snapshot(self) -> Mapping[str, Any]:
        """The state now, kept as it is; with ``cache`` and a getter that has ``deferred()`` (the AgentDojo adapter's
        :class:`~icml26.air.integrations.agentdojo.StateView` with ``defer=True``), a :class:`DeferredView` that is
        built when first read, or by the getter before a call that can change the state."""
        if self.cache and self._cached is None:
            if self._deferred is not None:
                return self._deferred
            deferred = getattr(self.getter, "deferred", None)
            if deferred is not None:
                v = deferred()
                if isinstance(v, DeferredView):
                    self._deferred = v
                else:
                    self._cached = v
                return v
        return self.view() if self.fresh else copy.deepcopy(self.getter())

    def invalidate(self) -> None:
        """A call has run: the next view is built again."""
        self._cached = None
        self._deferred = None


class DeferredView(Mapping):
    """A state view taken now and built on its first read (``build`` returns it).

    Whoever hands one out must build it before the state can change (the AgentDojo adapter's ``StateView`` does,
    before any call that can change the environment), so reading it late gives the state as it was when taken.
    Copies and pickles are of the built view.

    Example:
        >>> builds = []
        >>> v = DeferredView(lambda: builds.append(1) or {"n": 1})
        >>> len(builds), v["n"], dict(v), v == {"n": 1}, len(builds)
        (0, 1, {'n': 1}, True, 1)
    """

    __slots__ = ("_build", "_value")

    def __init__(self, build: Callable[[], Mapping[str, Any]]):
        self._build: Callable[[], Mapping[str, Any]] | None = build
        self._value: Mapping[str, Any] | None = None

    @property
    def built(self) -> bool:
        return self._build is None

    def value(self) -> Mapping[str, Any]:
        """The view (built now if it is not yet)."""
        if self._build is not None:
            build, self._build = self._build, None
            self._value = build()
        return self._value

    def __getitem__(self, key: Any) -> Any:
        return self.value()[key]

    def __contains__(self, key: object) -> bool:
        return key in self.value()

    def __iter__(self) -> Any:
        return iter(self.value())

    def __len__(self) -> int:
        return len(self.value())

    def __eq__(self, other: object) -> bool:
        return self.value() == (other.value() if isinstance(other, DeferredView) else other)

    __hash__ = None  # type: ignore[assignment]

    def __reduce__(self) -> Any:
        return _built, (self.value(),)

    def __repr__(self) -> str:
        return f"DeferredView({self.value()!r})"


def _built(value: Any) -> Any:
    return value


def diff(before: Any, after: Any, path: str = "") -> list[dict[str, Any]]:
    """Changes between two JSON-like values: ``[{"path", "before", "after"}]`` (missing = None); a
    :class:`DeferredView` is compared as the view it builds."""
    if isinstance(before, DeferredView):
        before = before.value()
    if isinstance(after, DeferredView):
        after = after.value()
    return _diff(before, after, path)


def _diff(before: Any, after: Any, path: str) -> list[dict[str, Any]]:
    if before is after:                      # a cached view shared between hooks: nothing changed
        return []
    if isinstance(before, Mapping) and isinstance(after, Mapping):
        if before == after:                  # equal mappings (compared in C): no change below them either
            return []
        out = []
        for k in sorted(set(before) | set(after), key=str):
            out += _diff(before.get(k), after.get(k), f"{path}.{k}" if path else str(k))
        return out
    return [] if before == after else [{"path": path, "before": before, "after": after}]
