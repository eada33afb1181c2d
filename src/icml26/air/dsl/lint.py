"""AIR's dsl layer, the linter: every problem in a rule file, and what a deployment cannot satisfy."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..core.errors import RuleSyntaxError
from .checks import BOUND_FIELDS, CALL_PHASES, RuleSchema, _semantic_errors, schema_errors, with_manifest
from .parser import parse

__all__ = ["BOUND_FIELDS", "CALL_PHASES", "Diagnostic", "RuleSchema", "lint", "schema_errors", "with_manifest"]


@dataclass
class Diagnostic:
    file: str
    line: int
    column: int
    message: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.column}: {self.message}"


def lint(text: str, *, file: str = "<rules>", schema: RuleSchema | None = None,
         manifest: Any = None) -> list[Diagnostic]:
    """Every problem in a rule file (empty when it is fine).

    Beyond :func:`parse`'s checks: paths under ``call``, ``ctx``, ``snap`` and ``incident`` must name fields the
    runtime binds, ``semantic(...)`` needs a configured backend (``schema.semantic``), and with a ``schema`` or a
    tool ``manifest`` (:meth:`RuleSchema.from_manifest`; it fills what the schema leaves None) the references that
    cannot fire are refused: trigger tools and contain/recover tools the deployment does not have, ``call.args.X``
    that no tool the trigger matches declares, ``state.X`` paths the state view does not have, and recovery tools
    outside ``schema.recovery_tools``. Each message names the rule and the name, with the closest known name.

    Example:
        >>> [d.message for d in lint('rule r on before_action(x) detect : call.arg.to == "a" contain - block end')]
        ['rule r: call.arg is not bound (call has: name, args, origin, effects, targets, content, content_entities)']
        >>> [d.message for d in lint('rule r on before_action(email.send) detect : call.args.too == "a" end',
        ...                          schema=RuleSchema(tools={"email.send": ("to", "subject", "body")}))]
        ["rule r: call.args.too: no parameter 'too' in email.send (did you mean 'to'?)"]
    """
    try:
        rules = parse(text, file=file, check=False)
    except RuleSyntaxError as exc:
        return [Diagnostic(exc.file, exc.line, exc.column, exc.detail)]
    problems = _semantic_errors(rules) + schema_errors(rules, with_manifest(schema, manifest))
    return [Diagnostic(file, line, 1, m) for line, m in problems]
