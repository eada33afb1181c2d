"""AIR's dsl layer, the checks parse and lint share: known predicates and roots, unique rule names, and what a
deployment (a :class:`RuleSchema`, or a tool manifest through :meth:`RuleSchema.from_manifest`) cannot satisfy."""

from __future__ import annotations

import difflib
import fnmatch
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from .nodes import ROOTS, SEVERITIES, Cond, Lit, Path_, Rule, RuleSet, _quantified, _walk
from .registry import _PREDICATES


def _semantic_errors(rules: RuleSet) -> list[tuple[int, str]]:
    out: list[tuple[int, str]] = []
    names = set()
    known = set(_PREDICATES) | set(rules.macros)
    for r in rules:
        where = f"rule {r.name}"
        if r.name in names:
            out.append((r.line, f"{where}: duplicate rule name"))
        names.add(r.name)
        if r.severity not in SEVERITIES:
            out.append((r.line, f"{where}: unknown severity {r.severity!r}"))
        if not r.detect:
            out.append((r.line, f"{where}: needs at least one detect condition"))
        conds = [*r.detect, *([r.when] if r.when else []), *([r.verify] if r.verify else [])]
        conds += [v for a in (*r.contain, *r.recover) for _, v in a.kwargs]
        for c in conds:
            bound = _quantified(c)
            for node in _walk(c):
                if isinstance(node, Cond) and node.op == "pred" and node.args[0] not in known:
                    out.append((r.line, f"{where}: unknown predicate {node.args[0]!r} "
                                        f"(registered: {sorted(known)})"))
                if isinstance(node, Path_) and node.root not in ROOTS and node.root not in bound and not any(
                        node.root in m.params for m in rules.macros.values()):
                    out.append((r.line, f"{where}: unknown root {node.root!r} in {node.text()} "
                                        f"(roots: {', '.join(ROOTS)})"))
        if r.verify is not None and not r.recover:
            out.append((r.line, f"{where}: verify without recover actions"))
    for m in rules.macros.values():
        bound = _quantified(m.body)
        for node in _walk(m.body):
            if isinstance(node, Path_) and node.root not in ROOTS and node.root not in m.params and node.root not in bound:
                out.append((0, f"predicate {m.name}: unknown name {node.root!r}"))
    return out


# the fields the runtime binds under each root (``state`` is the environment's own shape: see RuleSchema)
BOUND_FIELDS = {
    "call": ("name", "args", "origin", "effects", "targets", "content", "content_entities"),
    "ctx": ("user_task", "user_delegated", "steps", "step", "strings_from_tool_outputs", "strings_from_instructions",
            "user_mentioned_addresses", "user_mentioned_paths", "known_parties", "vouched_parties"),
    "snap": ("pre_step",),
    "incident": ("diff", "call"),
}
# the phases whose rules see a tool call (``call`` is bound); before_step and finish rules see none
CALL_PHASES = ("before_action", "after_action", "state_change")


@dataclass(frozen=True)
class RuleSchema:
    """What a deployment's rules may refer to, for :func:`lint`.

    Args:
        tools: tool name -> its parameter names, or None for a tool whose parameters are not declared. Given, it
            is every tool the agent has: a trigger pattern or a contain/recover tool that names none of them is an
            error, and ``call.args.X`` must name a parameter of some tool the rule's triggers match (checked only
            when all of those tools declare their parameters).
        state: an example state view; dotted paths under ``state`` (and ``snap.pre_step``) must follow its keys
            while they are mappings (a key whose value is not a mapping ends the check there).
        recovery_tools: the tools recovery may call (a tool's declared inverse operations); None: not checked.
        semantic: whether a ``semantic(...)`` backend is configured (without one such checks are refused).
    """

    tools: Mapping[str, Sequence[str] | None] | None = None
    state: Any = None
    recovery_tools: frozenset[str] | None = None
    semantic: bool = False

    @classmethod
    def from_manifest(cls, manifest: Any, **kwargs: Any) -> RuleSchema:
        """The schema a :class:`~icml26.air.policy.manifest.Manifest` declares: its tools with their ``args``
        (None where a tool does not declare them) and, where it declares ``state`` (the state view's top-level
        keys), those keys. Keyword arguments go to the schema (``recovery_tools``, ``semantic``, ``state``).

        Example:
            >>> from types import SimpleNamespace as NS
            >>> m = NS(tools={"fs.remove": NS(args=("path",)), "fs.list": NS(args=None)}, state=("files", "trash"))
            >>> s = RuleSchema.from_manifest(m)
            >>> s.tools, s.state
            ({'fs.remove': ('path',), 'fs.list': None}, {'files': None, 'trash': None})
        """
        tools = {name: spec.args for name, spec in manifest.tools.items()}
        keys = getattr(manifest, "state", None)
        state = dict.fromkeys(keys) if keys is not None else None
        return cls(**{"tools": tools, "state": state, **kwargs})


def with_manifest(schema: RuleSchema | None, manifest: Any) -> RuleSchema:
    """``schema`` (default: an empty one) with the tools and state a ``manifest`` declares where it has none."""
    schema = schema or RuleSchema()
    if manifest is None:
        return schema
    declared = RuleSchema.from_manifest(manifest)
    return replace(schema, tools=schema.tools if schema.tools is not None else declared.tools,
                   state=schema.state if schema.state is not None else declared.state)


def schema_errors(rules: RuleSet, schema: RuleSchema) -> list[tuple[int, str]]:
    """``(line, message)`` for references a deployment cannot satisfy (see :func:`lint`)."""
    out: list[tuple[int, str]] = []
    for r in rules:
        where = f"rule {r.name}"
        if schema.tools is not None:
            out += [(r.line, f"{where}: {m}") for m in _tool_errors(r, schema.tools)]
        matched = _matched_tools(r, schema.tools) if schema.tools is not None else None
        conds = [*r.detect, *([r.when] if r.when else []), *([r.verify] if r.verify else [])]
        exprs = [v for a in (*r.contain, *r.recover) for _, v in a.kwargs]
        for node in (n for c in [*conds, *exprs] for n in _walk(c)):
            if isinstance(node, Cond) and node.op == "semantic" and not schema.semantic:
                out.append((r.line, f"{where}: semantic(...) needs an LLM backend and none is configured"))
            if not isinstance(node, Path_) or not node.parts or not isinstance(node.parts[0], str):
                continue
            first = node.parts[0]
            if node.root in BOUND_FIELDS and first not in BOUND_FIELDS[node.root]:
                out.append((r.line, f"{where}: {node.root}.{first} is not bound "
                                    f"({node.root} has: {', '.join(BOUND_FIELDS[node.root])})"))
            elif node.root == "call" and first == "args" and len(node.parts) > 1 and matched:
                bad = _arg_error(node, matched, schema.tools)
                if bad:
                    out.append((r.line, f"{where}: {bad}"))
            elif node.root in ("state", "snap") and schema.state is not None:
                parts = node.parts[1:] if node.root == "snap" else node.parts
                bad = _state_path_error(schema.state, parts)
                if bad:
                    out.append((r.line, f"{where}: {node.text()}: {bad}"))
        if schema.recovery_tools is not None:
            for a in r.recover:
                if a.kind == "tool" and a.tool not in schema.recovery_tools:
                    out.append((r.line, f"{where}: recovery may not call {a.tool!r} (allowed: "
                                        f"{', '.join(sorted(schema.recovery_tools)) or 'none'})"))
    return out


def _did_you_mean(name: str, known: Sequence[str]) -> str:
    close = difflib.get_close_matches(name, list(known), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _is_pattern(name: str) -> bool:
    return any(ch in name for ch in "*?[")


def _tool_errors(rule: Rule, tools: Mapping[str, Sequence[str] | None]) -> list[str]:
    """Trigger patterns that match no tool, and contain/recover tools that are not tools, or arguments they
    do not take."""
    out = []
    for t in rule.triggers:
        for g in t.tools:
            if not any(fnmatch.fnmatchcase(name, g) for name in tools):
                what = "pattern" if _is_pattern(g) else "tool"
                out.append(f"trigger {what} {g!r} matches no declared tool{_did_you_mean(g, sorted(tools))}")
    for a in (*rule.contain, *rule.recover):
        if a.kind != "tool" or _is_pattern(a.tool):
            continue
        if a.tool not in tools:
            out.append(f"{a.tool}(...) is not a declared tool{_did_you_mean(a.tool, sorted(tools))}")
            continue
        params = tools[a.tool]
        for k, _ in a.kwargs:
            if params is not None and k not in params:
                out.append(f"{a.tool}({k}=...): no parameter {k!r}{_did_you_mean(k, params)}")
    return out


def _matched_tools(rule: Rule, tools: Mapping[str, Sequence[str] | None]) -> list[str]:
    """The tools whose calls can fire ``rule`` (its call-phase triggers' patterns; a trigger with none: every
    tool), in manifest order."""
    out: dict[str, None] = {}
    for t in rule.triggers:
        if t.phase in CALL_PHASES:
            out.update(dict.fromkeys(n for n in tools if not t.tools or any(fnmatch.fnmatchcase(n, g)
                                                                            for g in t.tools)))
    return list(out)


def _arg_error(node: Path_, matched: Sequence[str], tools: Mapping[str, Sequence[str] | None]) -> str:
    """``call.args.X`` where no tool in ``matched`` declares ``X`` ("" when one does, or one declares nothing)."""
    key = node.parts[1]
    if isinstance(key, Lit) and isinstance(key.value, str):
        key = key.value
    if not isinstance(key, str) or any(tools[n] is None for n in matched):
        return ""
    if any(key in (tools[n] or ()) for n in matched):
        return ""
    shown = ", ".join(matched) if len(matched) <= 3 else f"any of the {len(matched)} tools the trigger matches"
    params = sorted({p for n in matched for p in (tools[n] or ())})
    return f"{node.text()}: no parameter {key!r} in {shown}{_did_you_mean(key, params)}"


def _state_path_error(example: Any, parts: Sequence[Any]) -> str:
    v = example
    for p in parts:   # a bracketed key (``state.objects["Stove"]``) is data, not shape: the check ends there
        if not isinstance(p, str) or not isinstance(v, Mapping):
            return ""
        if p not in v:
            keys = sorted(map(str, v))
            return f"the state has no key {p!r} here (keys: {', '.join(keys[:12])}){_did_you_mean(p, keys)}"
        v = v[p]
    return ""
