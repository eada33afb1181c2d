"""AIR's dsl layer, the linter: every problem in a rule file, and what a deployment cannot satisfy."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..core.errors import RuleSyntaxError
from .checks import _semantic_errors
from .nodes import Cond, Path_, RuleSet, _walk
from .parser import parse

# the fields the runtime binds under each root (``state`` is the environment's own shape: see RuleSchema)
BOUND_FIELDS = {
    "call": ("name", "args", "origin", "effects", "targets", "content", "content_entities"),
    "ctx": ("user_task", "steps", "step", "strings_from_tool_outputs", "strings_from_instructions",
            "user_mentioned_addresses", "user_mentioned_paths", "known_parties"),
    "snap": ("pre_step",),
    "incident": ("diff", "call"),
}


@dataclass(frozen=True)
class RuleSchema:
    """What a deployment's rules may refer to, for :func:`lint`.

    Args:
        tools: tool name -> its parameter names (``call.args.X`` must name a parameter of a triggering tool).
        state: an example state view; dotted paths under ``state`` must follow its keys while they are mappings.
        recovery_tools: the tools recovery may call (a tool's declared inverse operations); None: not checked.
        semantic: whether a ``semantic(...)`` backend is configured (without one such checks are refused).
    """

    tools: Mapping[str, Sequence[str]] | None = None
    state: Any = None
    recovery_tools: frozenset[str] | None = None
    semantic: bool = False


@dataclass
class Diagnostic:
    file: str
    line: int
    column: int
    message: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.column}: {self.message}"


def lint(text: str, *, file: str = "<rules>", schema: RuleSchema | None = None) -> list[Diagnostic]:
    """Every problem in a rule file (empty when it is fine).

    Beyond :func:`parse`'s checks: paths under ``call``, ``ctx``, ``snap`` and ``incident`` must name fields the
    runtime binds, ``semantic(...)`` needs a configured backend (``schema.semantic``), and with a ``schema`` the
    tool arguments, state paths and recovery tools are checked against it.

    Example:
        >>> [d.message for d in lint('rule r on before_action(x) detect : call.arg.to == "a" contain - block end')]
        ['rule r: call.arg is not bound (call has: name, args, origin, effects, targets, content, content_entities)']
    """
    try:
        rules = parse(text, file=file, check=False)
    except RuleSyntaxError as exc:
        return [Diagnostic(exc.file, exc.line, exc.column, exc.detail)]
    problems = _semantic_errors(rules) + schema_errors(rules, schema or RuleSchema())
    return [Diagnostic(file, line, 1, m) for line, m in problems]


def schema_errors(rules: RuleSet, schema: RuleSchema) -> list[tuple[int, str]]:
    """``(line, message)`` for references a deployment cannot satisfy (see :func:`lint`)."""
    out: list[tuple[int, str]] = []
    for r in rules:
        where = f"rule {r.name}"
        conds = [*r.detect, *([r.when] if r.when else []), *([r.verify] if r.verify else [])]
        exprs = [v for a in (*r.contain, *r.recover) for _, v in a.kwargs]
        tools = [g for t in r.triggers for g in t.tools]
        known_tools = schema.tools is not None and tools and all(g in schema.tools for g in tools)
        for node in (n for c in [*conds, *exprs] for n in _walk(c)):
            if isinstance(node, Cond) and node.op == "semantic" and not schema.semantic:
                out.append((r.line, f"{where}: semantic(...) needs an LLM backend and none is configured"))
            if not isinstance(node, Path_) or not node.parts or not isinstance(node.parts[0], str):
                continue
            first = node.parts[0]
            if node.root in BOUND_FIELDS and first not in BOUND_FIELDS[node.root]:
                out.append((r.line, f"{where}: {node.root}.{first} is not bound "
                                    f"({node.root} has: {', '.join(BOUND_FIELDS[node.root])})"))
            elif node.root == "call" and first == "args" and known_tools and len(node.parts) > 1 and isinstance(
                    node.parts[1], str) and not any(node.parts[1] in schema.tools[g] for g in tools):
                out.append((r.line, f"{where}: {node.text()}: no parameter {node.parts[1]!r} in "
                                    f"{', '.join(tools)}"))
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


def _state_path_error(example: Any, parts: Sequence[Any]) -> str:
    v = example
    for p in parts:
        if not isinstance(p, str) or not isinstance(v, Mapping):
            return ""
        if p not in v:
            return f"the state has no key {p!r} here (keys: {', '.join(sorted(map(str, v))[:12])})"
        v = v[p]
    return ""
