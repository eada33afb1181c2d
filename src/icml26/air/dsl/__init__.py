"""AIR's second layer, dsl: the rule language (grammar, AST, evaluator, linter, predicate registry).

A declarative incident-response lifecycle per rule, parsed with lark, never executed. Modules: ``nodes`` (the
AST and its text form), ``registry`` (predicates), ``checks`` and ``parser`` (text to AST), ``lint``,
``evaluator``. The errors and the RE2 helpers are the core layer's, re-exported here.

A rule file holds rules and predicate definitions::

    rule unrequested_deletion severity high
    on after_action(shell.run)
    detect
      : call.args.command matches "\\\\brm\\\\b"
      : state.fs.deleted != []
      : not user_asked(ctx.user_task, "delete")
    contain
      - block
      - quarantine_tool
    recover
      - fs.restore(paths=state.fs.deleted)
      verify state.fs.deleted == []
    eradicate
      synthesize rule from incident
      scope shell.run
    end

Grammar (abridged): ``rule NAME meta* on trigger [when cond] detect [contain] [recover] [eradicate] end``;
meta = ``severity low|medium|high|critical | priority INT | tags [a, b] | fail closed|open``; trigger = ``PHASE[(tool|glob*)]`` joined
by ``|`` with PHASE in before_step, before_action, after_action, state_change, finish; detect = ``: cond`` lines
(a conjunction) with ``confirm by llm|user|rule_only``; contain/recover = ``- action`` lines, an action being an
enforcement keyword (block, stop, skip, ask_user, self_reflect, quarantine_tool, snapshot, alert), a tool call
``tool.name(arg=expr, ...)``, ``guide "text"`` or ``undo`` (the incident call's inverse operation declared in the
tool manifest, arguments bound from the call and the state diff: ``policy/manifest.py``); ``verify cond``; eradicate = ``synthesize rule [from NAME]``,
``scope TOOL``, ``validate on NAME``, ``max_predicates INT``. Conditions: ``or``, ``and``, ``not``, comparisons
(== != < <= > >=), ``matches "regex"``, ``in``, quantifiers over state objects ``any(x in expr: cond)`` and
``all(x in expr: cond)`` (a mapping's values, each with its key as ``x.key``), ``semantic("question", expr...)`` (the only LLM-backed check) and
whitelisted predicates ``NAME(expr, ...)`` registered in Python with :func:`predicate`. Expressions: paths over
the roots ``call``, ``result``, ``state``, ``snap``, ``ctx``, ``incident`` (``a.b["k"][0]``), strings, numbers,
lists, ``true``/``false``/``null``. ``predicate NAME(x, y): cond`` defines a macro in the file itself.

Example:
    >>> rules = parse('rule r on after_action(shell.run) detect : call.args.command matches "rm" contain - block end')
    >>> rules[0].name, rules[0].triggers[0].phase, rules[0].contain[0].kind
    ('r', 'after_action', 'block')
    >>> parse(rules.to_text()) == rules
    True
"""

from __future__ import annotations

from ..core.errors import CheckError, RuleSyntaxError
from ..core.regex import MAX_REGEX_CHARS, compile_regex, findall_utf8, spans_utf8
from .evaluator import MAX_QUANT_ITEMS, MISSING, Evaluator, resolve
from .lint import BOUND_FIELDS, Diagnostic, RuleSchema, lint, schema_errors, with_manifest
from .nodes import (
    ENFORCEMENTS,
    PHASES,
    QUANTIFIERS,
    ROOTS,
    SEVERITIES,
    Action,
    Cond,
    Eradicate,
    ListExpr,
    Lit,
    Path_,
    PredicateDef,
    Rule,
    RuleSet,
    Trigger,
    action_text,
    cond_text,
    count_checks,
    count_predicates,
    expr_text,
    mentions_root,
    rule_text,
)
from .parser import (
    GRAMMAR,
    MAX_INT_DIGITS,
    MAX_NESTING,
    MAX_TEXT_CHARS,
    MAX_TREE_DEPTH,
    load,
    parse,
    read_rule_text,
)
from .registry import predicate, registered_predicates

__all__ = [
    "BOUND_FIELDS",
    "ENFORCEMENTS",
    "GRAMMAR",
    "MAX_INT_DIGITS",
    "MAX_NESTING",
    "MAX_QUANT_ITEMS",
    "MAX_REGEX_CHARS",
    "MAX_TEXT_CHARS",
    "MAX_TREE_DEPTH",
    "MISSING",
    "PHASES",
    "QUANTIFIERS",
    "ROOTS",
    "SEVERITIES",
    "Action",
    "CheckError",
    "Cond",
    "Diagnostic",
    "Eradicate",
    "Evaluator",
    "ListExpr",
    "Lit",
    "Path_",
    "PredicateDef",
    "Rule",
    "RuleSchema",
    "RuleSet",
    "RuleSyntaxError",
    "Trigger",
    "action_text",
    "compile_regex",
    "cond_text",
    "count_checks",
    "count_predicates",
    "expr_text",
    "findall_utf8",
    "lint",
    "load",
    "mentions_root",
    "parse",
    "predicate",
    "read_rule_text",
    "registered_predicates",
    "resolve",
    "rule_text",
    "schema_errors",
    "spans_utf8",
    "with_manifest",
]
