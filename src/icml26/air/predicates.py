"""The whitelisted predicates AIR rule files may call (registered in code; rule files never contain code).

Example:
    >>> user_asked("Please delete the build folder", "delete|remove")
    True
    >>> flammable_near({"Candle": {"parentReceptacle": "Table"}, "Cloth": {"parentReceptacle": "Table",
    ...                 "flammable": True}}, "Candle")
    True
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from .dsl import predicate


@predicate("user_asked")
def user_asked(task: str, pattern: str) -> bool:
    """Whether the user's task uses any of the words in ``pattern`` (a ``|``-separated alternation)."""
    if not isinstance(task, str) or not isinstance(pattern, str):
        return False
    return re.search(r"\b(?:" + pattern + r")", task, flags=re.IGNORECASE) is not None


@predicate("holds_flag")
def holds_flag(objects: Mapping[str, Any], container: str, flag: str) -> bool:
    """Whether any object inside ``container`` has ``flag`` set (e.g. a metal object in the microwave)."""
    inside = objects.get(container, {}).get("contents", [])
    return any(objects.get(o, {}).get(flag) for o in inside)


@predicate("flammable_near")
def flammable_near(objects: Mapping[str, Any], name: str) -> bool:
    """Whether a flammable object shares ``name``'s receptacle."""
    where = objects.get(name, {}).get("parentReceptacle")
    return where is not None and any(v.get("flammable") and v.get("parentReceptacle") == where
                                     for k, v in objects.items() if k != name)


@predicate("has_id")
def has_id(items: Sequence[Mapping[str, Any]], item_id: str) -> bool:
    """Whether a list of records holds one with ``id == item_id``."""
    return any(isinstance(i, Mapping) and i.get("id") == item_id for i in items)


@predicate("contains_any")
def contains_any(text: Any, strings: Sequence[str]) -> bool:
    """Whether ``text`` contains any of ``strings`` (those of at least 6 characters)."""
    t = text if isinstance(text, str) else str(text)
    return any(isinstance(s, str) and len(s) >= 6 and s in t for s in strings)


@predicate("mentions")
def mentions(task: str, value: Any) -> bool:
    """Whether the user's task contains ``value`` verbatim."""
    return isinstance(task, str) and str(value) in task


@predicate("asked_for")
def asked_for(task: str, effect: str) -> bool:
    """Whether the user's task asks for an effect class (``destroys``, ``moves_money``, ...): one of the class's
    request words (``manifest.EFFECT_INTENT``, written once per class) occurs in the task."""
    from .manifest import EFFECT_INTENT

    if not isinstance(task, str) or effect not in EFFECT_INTENT:
        return False
    return re.search(r"\b(?:" + EFFECT_INTENT[effect] + r")", task, flags=re.IGNORECASE) is not None


@predicate("named_by_user")
def named_by_user(task: str, value: Any) -> bool:
    """Whether the user's task names ``value``, compared in normalised form (case, whitespace, invisible
    characters, ``[at]``/``(dot)``), ignoring a URL scheme and ``www.``."""
    from .responder import normalize

    if not isinstance(task, str) or not isinstance(value, str | int | float) or isinstance(value, bool):
        return False
    v = _bare(normalize(str(value)))
    return bool(v) and v in _bare(normalize(task))


def _bare(s: str) -> str:
    return re.sub(r"https?://|www\.", "", s).rstrip("/")
