"""AIR's dsl layer, the AST: rules, triggers, conditions, actions and rule sets, their walk and their text form."""

from __future__ import annotations

import fnmatch
import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

PHASES = ("before_step", "before_action", "after_action", "state_change", "finish")
ENFORCEMENTS = ("block", "stop", "skip", "ask_user", "self_reflect", "quarantine_tool", "snapshot", "alert")
SEVERITIES = ("low", "medium", "high", "critical")
ROOTS = ("call", "result", "state", "snap", "ctx", "incident")
QUANTIFIERS = ("any", "all")


# --------------------------------------------------------------------------------------------------- the AST
@dataclass(frozen=True)
class Path_:
    """A path ``root.a["k"][0]``: ``parts`` are names (str) or sub-expressions in brackets."""

    root: str
    parts: tuple[Any, ...] = ()

    def text(self) -> str:
        return expr_text(self)


@dataclass(frozen=True)
class Lit:
    """A literal (str, int, float, bool, None)."""

    value: Any


@dataclass(frozen=True)
class ListExpr:
    items: tuple[Any, ...]


@dataclass(frozen=True)
class Cond:
    """A condition node: ``op`` in and, or, not, compare, matches, in, semantic, pred, any, all; ``args`` its
    operands (a quantifier's: the variable name, the collection expression, the body)."""

    op: str
    args: tuple[Any, ...]
    cmp: str = ""


@dataclass(frozen=True)
class Action:
    """``kind`` an enforcement keyword, ``"tool"`` (``tool`` and ``kwargs``), ``"guide"`` (``text``) or ``"undo"``."""

    kind: str
    tool: str = ""
    kwargs: tuple[tuple[str, Any], ...] = ()
    text: str = ""


@dataclass(frozen=True)
class Trigger:
    phase: str
    tools: tuple[str, ...] = ()

    def matches(self, phase: str, tool: str | None) -> bool:
        if phase != self.phase:
            return False
        if not self.tools:
            return True
        return tool is not None and any(fnmatch.fnmatchcase(tool, g) for g in self.tools)


@dataclass(frozen=True)
class Eradicate:
    synthesize: bool = False
    source: str = ""
    scope: str = ""
    validate_on: str = ""
    max_predicates: int = 4


@dataclass(frozen=True)
class Rule:
    """One incident-response rule (see the module docstring)."""

    name: str
    triggers: tuple[Trigger, ...]
    detect: tuple[Cond, ...]
    severity: str = "medium"
    priority: int = 0
    tags: tuple[str, ...] = ()
    when: Cond | None = None
    confirm: str = "rule_only"
    contain: tuple[Action, ...] = ()
    recover: tuple[Action, ...] = ()
    verify: Cond | None = None
    eradicate: Eradicate | None = None
    provenance: str = "developer"
    fail: str = "closed"            # a check that errs (LLM timeout, unknown answer, time budget): closed fires
    line: int = field(default=0, compare=False)

    def fires_on(self, phase: str, tool: str | None) -> bool:
        return any(t.matches(phase, tool) for t in self.triggers)

    def is_prevention(self) -> bool:
        """A rule that only blocks before an action (what eradication may add)."""
        return all(t.phase == "before_action" for t in self.triggers) and not self.recover and all(
            a.kind in ("block", "alert", "self_reflect", "ask_user") for a in self.contain)

    def to_text(self) -> str:
        return rule_text(self)


@dataclass(frozen=True)
class PredicateDef:
    name: str
    params: tuple[str, ...]
    body: Cond


class RuleSet(Sequence[Rule]):
    """Parsed rules (in file order) plus the file's predicate macros."""

    def __init__(self, rules: Sequence[Rule] = (), macros: Mapping[str, PredicateDef] | None = None):
        self.rules = list(rules)
        self.macros = dict(macros or {})

    def __getitem__(self, i: Any) -> Any:
        return self.rules[i]

    def __len__(self) -> int:
        return len(self.rules)

    def __iter__(self) -> Iterator[Rule]:
        return iter(self.rules)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RuleSet) and self.rules == other.rules and self.macros == other.macros

    def __repr__(self) -> str:
        return f"RuleSet({[r.name for r in self.rules]})"

    def to_text(self) -> str:
        parts = [f"predicate {m.name}({', '.join(m.params)}): {cond_text(m.body)}" for m in self.macros.values()]
        return "\n\n".join(parts + [rule_text(r) for r in self.rules]) + "\n"

    def extended(self, rules: Sequence[Rule]) -> RuleSet:
        return RuleSet([*self.rules, *rules], self.macros)


def _walk(node: Any) -> Iterator[Any]:
    yield node
    if isinstance(node, Cond):
        for a in node.args:
            yield from _walk(a)
    elif isinstance(node, Path_):
        for p in node.parts:
            if not isinstance(p, str):
                yield from _walk(p)
    elif isinstance(node, ListExpr):
        for a in node.items:
            yield from _walk(a)


def _quantified(c: Any) -> set[str]:
    return {n.args[0] for n in _walk(c) if isinstance(n, Cond) and n.op in QUANTIFIERS}


# --------------------------------------------------------------------------------------------- back to text
def expr_text(e: Any) -> str:
    if isinstance(e, Path_):
        out = e.root
        for p in e.parts:
            out += f".{p}" if isinstance(p, str) else f"[{expr_text(p)}]"
        return out
    if isinstance(e, Lit):
        v = e.value
        if isinstance(v, bool):
            return "true" if v else "false"
        if v is None:
            return "null"
        if isinstance(v, str):
            return json.dumps(v)
        return repr(v)
    if isinstance(e, ListExpr):
        return "[" + ", ".join(expr_text(i) for i in e.items) + "]"
    raise TypeError(f"not an expression: {e!r}")


def cond_text(c: Cond) -> str:
    if c.op in ("and", "or"):
        return "(" + f" {c.op} ".join(cond_text(a) for a in c.args) + ")"
    if c.op == "not":
        return f"not {cond_text(c.args[0])}" if c.args[0].op not in ("compare", "matches", "in") else \
            f"not ({cond_text(c.args[0])})"
    if c.op == "compare":
        return f"{expr_text(c.args[0])} {c.cmp} {expr_text(c.args[1])}"
    if c.op == "matches":
        return f"{expr_text(c.args[0])} matches {json.dumps(c.args[1].value)}"
    if c.op == "in":
        return f"{expr_text(c.args[0])} in {expr_text(c.args[1])}"
    if c.op == "semantic":
        return "semantic(" + ", ".join([json.dumps(c.args[0].value), *(expr_text(a) for a in c.args[1:])]) + ")"
    if c.op in QUANTIFIERS:
        return f"{c.op}({c.args[0]} in {expr_text(c.args[1])}: {cond_text(c.args[2])})"
    if c.op == "pred":
        return f"{c.args[0]}(" + ", ".join(expr_text(a) for a in c.args[1:]) + ")"
    raise TypeError(f"unknown condition {c.op!r}")


def action_text(a: Action) -> str:
    if a.kind == "tool":
        return f"{a.tool}(" + ", ".join(f"{k}={expr_text(v)}" for k, v in a.kwargs) + ")"
    if a.kind == "guide":
        return f"guide {json.dumps(a.text)}"
    return a.kind                     # an enforcement keyword or undo


def rule_text(r: Rule) -> str:
    meta = f" severity {r.severity}" + (f" priority {r.priority}" if r.priority else "") + (
        f" tags [{', '.join(r.tags)}]" if r.tags else "") + (f" fail {r.fail}" if r.fail != "closed" else "")
    trig = " | ".join(t.phase + (f"({' | '.join(t.tools)})" if t.tools else "") for t in r.triggers)
    lines = [f"rule {r.name}{meta}", f"on {trig}"]
    if r.when is not None:
        lines.append(f"when {cond_text(r.when)}")
    lines.append("detect")
    lines += [f"  : {cond_text(c)}" for c in r.detect]
    if r.confirm != "rule_only":
        lines.append(f"  confirm by {r.confirm}")
    if r.contain:
        lines.append("contain")
        lines += [f"  - {action_text(a)}" for a in r.contain]
    if r.recover:
        lines.append("recover")
        lines += [f"  - {action_text(a)}" for a in r.recover]
        if r.verify is not None:
            lines.append(f"  verify {cond_text(r.verify)}")
    if r.eradicate is not None:
        e = r.eradicate
        lines.append("eradicate")
        if e.synthesize:
            lines.append("  synthesize rule" + (f" from {e.source}" if e.source else ""))
        if e.scope:
            lines.append(f"  scope {e.scope}")
        if e.validate_on:
            lines.append(f"  validate on {e.validate_on}")
        if e.max_predicates != 4:
            lines.append(f"  max_predicates {e.max_predicates}")
    lines.append("end")
    return "\n".join(lines)


def mentions_root(c: Any, roots: set[str]) -> bool:
    """Whether a condition or expression reads any of ``roots``."""
    return any(isinstance(n, Path_) and n.root in roots for n in _walk(c))


def count_predicates(r: Rule) -> int:
    """The checks in a rule's ``when`` and ``detect`` (:func:`count_checks`)."""
    return count_checks([*r.detect, *([r.when] if r.when else [])])


def count_checks(conds: Sequence[Cond]) -> int:
    """The checks (comparisons, ``in``, ``matches``, quantifiers, predicates; not ``and``/``or``/``not``) in
    ``conds``."""
    return sum(1 for c in conds for n in _walk(c) if isinstance(n, Cond) and n.op not in ("and", "or", "not"))
