"""AIR's runtime layer, contexts: ``ctx`` as rules read it, and the facts of an episode it derives from."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..core.entities import MAX_SCAN_CHARS, mentioned, scan_output
from ..core.text import NormalizedStrings
from ..policy.predicates import named_by_user


class Context(Mapping):
    """``ctx`` as rules read it: fixed values, then lazily built ones (each computed on its first read and kept),
    then more fixed values. Copied or pickled as a plain ``dict`` (every value built).

    Args:
        values: the values given now (``user_task``, ``steps``, ``step``).
        lazy: a mapping read on demand (a :class:`Context` of thunks shared by the contexts of one taint version)
            or a ``dict`` of zero-argument callables.
        tail: more values given now (the user's mentions).

    Example:
        >>> calls = []
        >>> c = Context({"a": 1}, {"b": lambda: calls.append(1) or 2})
        >>> len(calls), c["b"], c["b"], len(calls), dict(c)
        (0, 2, 2, 1, {'a': 1, 'b': 2})
    """

    __slots__ = ("_built", "_lazy", "_tail", "_values")

    def __init__(self, values: dict[str, Any], lazy: Mapping[str, Any], tail: Mapping[str, Any] | None = None):
        self._values, self._lazy, self._tail = values, lazy, tail if tail is not None else {}
        self._built: dict[str, Any] = {}

    def __getitem__(self, key: str) -> Any:
        if key in self._values:
            return self._values[key]
        if key in self._tail:
            return self._tail[key]
        if isinstance(self._lazy, Context):
            return self._lazy[key]
        if key not in self._built:
            self._built[key] = self._lazy[key]()    # KeyError for an unknown key
        return self._built[key]

    def __contains__(self, key: object) -> bool:
        return key in self._values or key in self._lazy or key in self._tail

    def __iter__(self) -> Any:
        yield from self._values
        yield from (k for k in self._lazy if k not in self._values)
        yield from (k for k in self._tail if k not in self._values and k not in self._lazy)

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def __reduce__(self) -> Any:
        return dict, (dict(self.items()),)

    def __repr__(self) -> str:
        return repr(dict(self.items()))


class _EpisodeFacts:
    """What an episode's contexts derive their lists from, fixed at its first context: the user's task and what it
    mentions (shared read-only), the known parties (or the state view they are read from, when a rule first needs
    them) and per-episode memos."""

    def __init__(self, user_task: str, named: bool, manifest: Any, known: Any):
        self.user_task, self.named, self.manifest = user_task, named, manifest
        self.mentioned = mentioned(user_task)
        self._known_src = known
        self._known: list[str] | None = None
        self._task_ents: set[str] | None = None
        self._named_memo: dict[str, bool] = {}

    def known_parties(self) -> list[str]:
        """The normalised parties under the manifest's ``known`` paths, as the episode's first context saw them."""
        if self._known is None:
            src = self._known_src
            self._known = (src if isinstance(src, NormalizedStrings) else NormalizedStrings() if src is None
                           else NormalizedStrings(self.manifest.known_parties(src)))
        return self._known

    def task_entities(self) -> set[str]:
        """The entities the user's task itself names (in the forms taint keeps: an amount as written and as a
        number)."""
        if self._task_ents is None:
            self._task_ents = scan_output(self.user_task[:MAX_SCAN_CHARS], self.named)[1]
        return self._task_ents

    def unvouched(self, instruction_taint: set[str], vouched: set[str]) -> list[str]:
        """The entities tool outputs introduced (``instruction_taint``) that neither the user's task, the known
        parties nor a source the user named (``vouched``) vouch for."""
        known = set(self.known_parties()) | vouched | self.task_entities()
        named = self._named_memo            # whether the task names x (the task is fixed)
        for x in instruction_taint:
            if x not in named:
                named[x] = named_by_user(self.user_task, x)
        return NormalizedStrings(sorted(x for x in instruction_taint if x not in known and not named[x]))
