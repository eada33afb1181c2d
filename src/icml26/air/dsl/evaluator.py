"""AIR's dsl layer, the evaluator: a condition's value on the bindings of a hook."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..core.errors import CheckError
from ..core.records import safe_json, safe_str
from ..core.regex import compile_regex
from .nodes import QUANTIFIERS, Cond, ListExpr, Lit, Path_, PredicateDef
from .registry import _PREDICATES

MAX_QUANT_ITEMS = 100_000       # any(...)/all(...) over a larger collection errs (the rule's fail policy decides)


# --------------------------------------------------------------------------------------------- evaluation
class _Missing:
    def __repr__(self) -> str:
        return "MISSING"


MISSING = _Missing()


def resolve(e: Any, env: Mapping[str, Any]) -> Any:
    """The value of an expression in ``env`` (roots -> values); a missing path gives ``MISSING``."""
    if isinstance(e, Lit):
        return e.value
    if isinstance(e, ListExpr):
        return [resolve(i, env) for i in e.items]
    if isinstance(e, Path_):
        if e.root not in env:
            return MISSING
        v = env[e.root]
        for p in e.parts:
            key = p if isinstance(p, str) else resolve(p, env)
            if key is MISSING:
                return MISSING
            if isinstance(v, Mapping):
                if key not in v:
                    return MISSING
                v = v[key]
            elif isinstance(v, list | tuple) and isinstance(key, int) and not isinstance(key, bool):
                if not -len(v) <= key < len(v):
                    return MISSING
                v = v[key]
            elif isinstance(p, str) and hasattr(v, p) and not p.startswith("_"):
                v = getattr(v, p)
            else:
                return MISSING
        return v
    raise TypeError(f"not an expression: {e!r}")


_CMP: dict[str, Callable[[Any, Any], bool]] = {
    "==": lambda a, b: a == b, "!=": lambda a, b: a != b, "<": lambda a, b: a < b, "<=": lambda a, b: a <= b,
    ">": lambda a, b: a > b, ">=": lambda a, b: a >= b}


@dataclass
class Evaluator:
    """Evaluates conditions; ``semantic`` is called for ``semantic(...)`` checks. A check it cannot decide raises
    :class:`CheckError`: no backend, or an answer that is not a boolean (:func:`is_boolean`; None is no answer)."""

    macros: Mapping[str, PredicateDef] = field(default_factory=dict)
    semantic: Callable[[str, list[Any], Mapping[str, Any]], bool] | None = None
    errors: list[str] = field(default_factory=list)

    def __call__(self, c: Cond, env: Mapping[str, Any]) -> bool:
        op = c.op
        if op == "and":
            return all(self(a, env) for a in c.args)
        if op == "or":
            return any(self(a, env) for a in c.args)
        if op == "not":
            return not self(c.args[0], env)
        if op == "compare":
            a, b = resolve(c.args[0], env), resolve(c.args[1], env)
            if a is MISSING or b is MISSING:
                return False
            try:
                return bool(_CMP[c.cmp](a, b))
            except TypeError:
                self.errors.append(f"cannot compare {_shown(a)} {c.cmp} {_shown(b)}")
                return False
        if op == "matches":
            v = resolve(c.args[0], env)
            return v is not MISSING and compile_regex(c.args[1].value).search(
                v if isinstance(v, str) else safe_json(v)) is not None
        if op == "in":
            a, b = resolve(c.args[0], env), resolve(c.args[1], env)
            if a is MISSING or b is MISSING:
                return False
            try:
                return a in b
            except TypeError:
                return False
        if op in QUANTIFIERS:
            # any(x in S: c) / all(x in S: c): c with x bound to each item of S (a mapping's values, each with its
            # key as ``key``); a missing or non-collection S makes both False, as does one over MAX_QUANT_ITEMS
            var, coll, body = c.args
            items = _items(resolve(coll, env))
            if items is None:
                return False
            if len(items) > MAX_QUANT_ITEMS:
                self.errors.append(f"{op}({var} in ...): {len(items)} items exceed the limit of {MAX_QUANT_ITEMS}")
                return False
            test = (self(body, {**env, var: item}) for item in items)
            return any(test) if op == "any" else all(test)
        if op == "semantic":
            if self.semantic is None:
                raise CheckError("semantic(...) check with no semantic backend configured")
            args = [resolve(a, env) for a in c.args[1:]]
            answer = self.semantic(c.args[0].value, args, env)
            if not is_boolean(answer):         # None or "no" is no answer: an error (the rule's fail policy)
                raise CheckError(f"the semantic backend answered {type(answer).__name__} {_shown(answer)}, "
                                 "not a boolean")
            return bool(answer)
        if op == "pred":
            name, args = c.args[0], [resolve(a, env) for a in c.args[1:]]
            if name in self.macros:
                m = self.macros[name]
                if len(args) != len(m.params):
                    self.errors.append(f"predicate {name} takes {len(m.params)} arguments, got {len(args)}")
                    return False
                return self(m.body, {**env, **dict(zip(m.params, args, strict=True))})
            fn = _PREDICATES.get(name)
            if fn is None:
                self.errors.append(f"unknown predicate {name!r}")
                return False
            if any(a is MISSING for a in args):
                return False
            try:
                return bool(fn(*args))
            except Exception as exc:    # a predicate's failure is logged and counts as not firing
                self.errors.append(f"predicate {name} raised {type(exc).__name__}: {exc}")
                return False
        raise ValueError(f"unknown condition {op!r}")


def is_boolean(value: Any) -> bool:
    """Whether ``value`` is a boolean: ``True``/``False`` or NumPy's ``bool_`` (what a backend computing
    ``similarity < threshold`` on arrays returns), never a truthy string, number or None.

    Example:
        >>> is_boolean(False), is_boolean(None), is_boolean("yes"), is_boolean(1)
        (True, False, False, False)
    """
    t = type(value)
    return t is bool or (t.__name__ == "bool" and t.__module__ == "numpy") or (
        t.__name__ == "bool_" and t.__module__ == "numpy")


def _shown(value: Any, limit: int = 80) -> str:
    """``repr(value)`` cut to ``limit`` characters, never raising (a huge integer, a hostile ``__repr__``)."""
    try:
        text = repr(value)
    except Exception:
        text = safe_str(value)
    return text if len(text) <= limit else text[:limit] + "..."


def _items(coll: Any) -> list[Any] | None:
    if isinstance(coll, Mapping):
        return [{**v, "key": k} if isinstance(v, Mapping) and "key" not in v else v for k, v in coll.items()]
    if isinstance(coll, list | tuple | set | frozenset):
        return list(coll)
    return None
