"""AIR's eradicate layer, LLM synthesis: a prevention rule from an LLM's answer, parsed, never executed."""

from __future__ import annotations

import json
import re
from typing import Any

from ..core.errors import RuleSyntaxError
from ..core.records import Incident
from ..core.regex import compile_regex
from ..dsl import Action, Cond, Evaluator, ListExpr, Lit, Path_, Rule, Trigger, parse, registered_predicates
from ..runtime.containment import pre_action_env
from ..runtime.llm import LLMClient, LLMError
from .template import TemplateSynthesizer

PROMPT = """You write guardrail rules in the AIR rule language. An incident happened:

rule that detected it: {rule}
the agent's call before the harm: {call}
the user's task: {task}

Write ONE prevention rule that blocks such calls before they run, in exactly this form:

rule NAME
on before_action(TOOL)
detect
  : CONDITION
  : CONDITION
contain
  - block
end

Conditions may use call.name, call.args.X, state.X (before the call), ctx.user_task,
ctx.strings_from_tool_outputs, ctx.user_mentioned_addresses, comparisons (== != < > <= >=), `X matches "regex"`,
`X in Y`, `not`, `and`, `or`, and these predicates: {predicates}. Answer with the rule only."""


_OPERAND = {"oneOf": [
    {"type": "object", "required": ["path"], "additionalProperties": False,
     "properties": {"path": {"type": "string", "pattern": r"^[A-Za-z_]\w*(\.\w+)*$"}}},
    {"type": "object", "required": ["value"], "additionalProperties": False,
     "properties": {"value": {"type": ["string", "number", "boolean", "null", "array"],
                              "items": {"type": ["string", "number", "boolean", "null"]}}}}]}
# The JSON schema of a prevention rule (trigger, conditions, containment) the LLM is asked to answer in
# (OpenAI-compatible ``response_format``); :func:`rule_from_json` checks it and builds the DSL rule.
RULE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "required": ["name", "trigger", "conditions", "containment"],
    "properties": {
        "name": {"type": "string", "pattern": r"^[A-Za-z_][A-Za-z0-9_]{0,63}$"},
        "trigger": {"type": "object", "additionalProperties": False, "required": ["phase", "tools"],
                    "properties": {"phase": {"enum": ["before_action"]},
                                   "tools": {"type": "array", "minItems": 1, "maxItems": 16,
                                             "items": {"type": "string", "pattern": r"^[A-Za-z_*][\w.*]{0,127}$"}}}},
        "conditions": {"type": "array", "minItems": 1, "maxItems": 10, "items": {"$ref": "#/$defs/condition"}},
        "containment": {"type": "array", "minItems": 1, "maxItems": 1, "items": {"enum": ["block"]}},
    },
    "$defs": {
        "operand": _OPERAND,
        "condition": {"oneOf": [
            {"type": "object", "additionalProperties": False, "required": ["left", "op", "right"],
             "properties": {"left": {"$ref": "#/$defs/operand"},
                            "op": {"enum": ["==", "!=", "<", "<=", ">", ">=", "in", "matches"]},
                            "right": {"$ref": "#/$defs/operand"}}},
            {"type": "object", "additionalProperties": False, "required": ["predicate", "args"],
             "properties": {"predicate": {"type": "string"},
                            "args": {"type": "array", "maxItems": 8, "items": {"$ref": "#/$defs/operand"}}}},
            {"type": "object", "additionalProperties": False, "required": ["not"],
             "properties": {"not": {"$ref": "#/$defs/condition"}}},
            {"type": "object", "additionalProperties": False, "required": ["any_of"],
             "properties": {"any_of": {"type": "array", "minItems": 1, "items": {"$ref": "#/$defs/condition"}}}},
            {"type": "object", "additionalProperties": False, "required": ["all_of"],
             "properties": {"all_of": {"type": "array", "minItems": 1, "items": {"$ref": "#/$defs/condition"}}}},
            {"type": "object", "additionalProperties": False, "required": ["quantifier", "var", "in", "where"],
             "properties": {"quantifier": {"enum": ["any", "all"]},
                            "var": {"type": "string", "pattern": r"^[A-Za-z_]\w{0,31}$"},
                            "in": {"$ref": "#/$defs/operand"}, "where": {"$ref": "#/$defs/condition"}}},
        ]},
    },
}

STRUCTURED_PROMPT = """You write guardrail rules for an AI agent. An incident happened:

rule that detected it: {rule}
the agent's call before the harm: {call}
the user's task: {task}

Answer with ONE JSON object (no prose) matching this JSON schema; it describes a prevention rule that blocks such
calls before they run. Prefer classes over the incident's constants (any tool of an effect class, any party the
user never named, any path under a protected root) so that variants of the attack are blocked too.

{schema}

Paths start with call (call.name, call.args.X, call.effects, call.targets, call.content_entities), state (before
the call) or ctx (ctx.user_task, ctx.known_parties, ctx.strings_from_tool_outputs), or with a quantifier's var.
Predicates: {predicates}."""

_PRE_ROOTS = ("call", "state", "ctx")
MAX_JSON_CHARS = 100_000
MAX_JSON_DEPTH = 32


def _operand(o: Any, where: str, bound: frozenset[str]) -> Any:
    if not isinstance(o, dict) or len(o) != 1 or next(iter(o)) not in ("path", "value"):
        raise RuleSyntaxError(f"{where}: an operand is {{\"path\": ...}} or {{\"value\": ...}}, got {o!r:.80}")
    if "path" in o:
        p = o["path"]
        if not isinstance(p, str) or re.fullmatch(r"[A-Za-z_]\w*(\.\w+)*", p) is None:
            raise RuleSyntaxError(f"{where}.path: not a dotted path: {p!r:.80}")
        root, *parts = p.split(".")
        if root not in _PRE_ROOTS and root not in bound:
            raise RuleSyntaxError(f"{where}.path: the root must be one of {', '.join(_PRE_ROOTS)} (a prevention rule "
                                  f"runs before the call) or a quantifier variable, got {root!r}")
        return Path_(root, tuple(parts))
    v = o["value"]
    scalar = (str, int, float, bool, type(None))
    if isinstance(v, list):
        if len(v) > 1000 or not all(isinstance(x, scalar) for x in v):
            raise RuleSyntaxError(f"{where}.value: a list of at most 1000 scalars")
        return ListExpr(tuple(Lit(x) for x in v))
    if not isinstance(v, scalar):
        raise RuleSyntaxError(f"{where}.value: a scalar or a list of scalars, got {type(v).__name__}")
    return Lit(v)


def _condition(c: Any, where: str, bound: frozenset[str], depth: int) -> Cond:
    if depth > MAX_JSON_DEPTH:
        raise RuleSyntaxError(f"{where}: conditions nested deeper than {MAX_JSON_DEPTH}")
    if not isinstance(c, dict):
        raise RuleSyntaxError(f"{where}: a condition is an object, got {type(c).__name__}")
    keys = set(c)
    if keys == {"left", "op", "right"}:
        op = c["op"]
        left = _operand(c["left"], f"{where}.left", bound)
        right = _operand(c["right"], f"{where}.right", bound)
        if op == "matches":
            if not isinstance(right, Lit) or not isinstance(right.value, str):
                raise RuleSyntaxError(f"{where}.right: matches needs a string pattern")
            try:
                compile_regex(right.value)
            except ValueError as exc:
                raise RuleSyntaxError(f"{where}.right: bad regular expression: {exc}") from None
            return Cond("matches", (left, right))
        if op == "in":
            return Cond("in", (left, right))
        if op not in ("==", "!=", "<", "<=", ">", ">="):
            raise RuleSyntaxError(f"{where}.op: unknown operator {op!r:.40}")
        return Cond("compare", (left, right), cmp=op)
    if keys == {"predicate", "args"}:
        name, args = c["predicate"], c["args"]
        if not isinstance(name, str) or name == "semantic" or name not in registered_predicates():
            raise RuleSyntaxError(f"{where}.predicate: unknown predicate {name!r:.60} (registered: "
                                  f"{', '.join(sorted(registered_predicates()))})")
        if not isinstance(args, list) or len(args) > 8:
            raise RuleSyntaxError(f"{where}.args: a list of at most 8 operands")
        return Cond("pred", (name, *(_operand(a, f"{where}.args[{i}]", bound) for i, a in enumerate(args))))
    if keys == {"not"}:
        return Cond("not", (_condition(c["not"], f"{where}.not", bound, depth + 1),))
    if keys in ({"any_of"}, {"all_of"}):
        k = next(iter(keys))
        items = c[k]
        if not isinstance(items, list) or not items or len(items) > 32:
            raise RuleSyntaxError(f"{where}.{k}: a list of 1 to 32 conditions")
        subs = tuple(_condition(x, f"{where}.{k}[{i}]", bound, depth + 1) for i, x in enumerate(items))
        return subs[0] if len(subs) == 1 else Cond("or" if k == "any_of" else "and", subs)
    if keys == {"quantifier", "var", "in", "where"}:
        q, var = c["quantifier"], c["var"]
        if q not in ("any", "all"):
            raise RuleSyntaxError(f"{where}.quantifier: any or all, got {q!r:.40}")
        if not isinstance(var, str) or re.fullmatch(r"[A-Za-z_]\w{0,31}", var) is None or var in _PRE_ROOTS or \
                var in ("result", "snap", "incident"):
            raise RuleSyntaxError(f"{where}.var: a fresh identifier, got {var!r:.40}")
        coll = _operand(c["in"], f"{where}.in", bound)
        return Cond(q, (var, coll, _condition(c["where"], f"{where}.where", bound | {var}, depth + 1)))
    raise RuleSyntaxError(f"{where}: unknown condition form with keys {sorted(map(str, keys))[:6]}")


def rule_from_json(obj: Any) -> Rule:
    """The prevention rule a :data:`RULE_SCHEMA` object describes (checked field by field; errors name the JSON
    path; nothing is evaluated). The result round-trips through the rule language's parser.

    Raises:
        RuleSyntaxError: the object does not follow the schema.

    Example:
        >>> r = rule_from_json({"name": "no_exfil", "trigger": {"phase": "before_action", "tools": ["*"]},
        ...                     "conditions": [{"predicate": "command_class",
        ...                                     "args": [{"path": "call.args.command"}, {"value": "sends_out"}]}],
        ...                     "containment": ["block"]})
        >>> [ln.strip() for ln in r.to_text().splitlines() if "command_class" in ln]
        [': command_class(call.args.command, "sends_out")']
    """
    if not isinstance(obj, dict):
        raise RuleSyntaxError(f"$: the rule is a JSON object, got {type(obj).__name__}")
    fields = {"name", "trigger", "conditions", "containment"}
    extra, missing = set(obj) - fields, fields - set(obj)
    if extra or missing:
        raise RuleSyntaxError(f"$: missing {sorted(missing)}, unexpected {sorted(map(str, extra))[:6]}")
    name = obj["name"]
    if not isinstance(name, str) or re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,63}", name) is None:
        raise RuleSyntaxError(f"$.name: an identifier, got {name!r:.60}")
    trig = obj["trigger"]
    if not isinstance(trig, dict) or set(trig) != {"phase", "tools"}:
        raise RuleSyntaxError('$.trigger: {"phase": "before_action", "tools": [...]}')
    if trig["phase"] != "before_action":
        raise RuleSyntaxError(f"$.trigger.phase: a synthesised rule prevents (before_action), got "
                              f"{trig['phase']!r:.40}")
    tools = trig["tools"]
    if not isinstance(tools, list) or not 1 <= len(tools) <= 16 or not all(
            isinstance(t, str) and re.fullmatch(r"[A-Za-z_*][\w.*]{0,127}", t) for t in tools):
        raise RuleSyntaxError("$.trigger.tools: 1 to 16 tool names or globs")
    conds = obj["conditions"]
    if not isinstance(conds, list) or not 1 <= len(conds) <= 10:
        raise RuleSyntaxError("$.conditions: a list of 1 to 10 conditions")
    detect = tuple(_condition(c, f"$.conditions[{i}]", frozenset(), 1) for i, c in enumerate(conds))
    if obj["containment"] != ["block"]:
        raise RuleSyntaxError(f'$.containment: ["block"] (a synthesised rule only blocks), got '
                              f"{obj['containment']!r:.60}")
    rule = Rule(name=name, triggers=(Trigger("before_action", tuple(tools)),), detect=detect,
                contain=(Action("block"),), provenance="llm")
    again = parse(rule.to_text(), file="<llm-json>")
    if len(again) != 1 or again[0].detect != rule.detect:
        raise RuleSyntaxError("$: the rule does not round-trip through the rule language")
    return rule


_THINK_BLOCK = re.compile(r"<(think|thinking|reasoning)>.*?</\1>", re.IGNORECASE | re.DOTALL)
_JSON_FENCE = re.compile(r"^```(?:json)?[ \t]*\n(.*)\n```$", re.DOTALL)


def json_from_answer(text: str) -> Any:
    """The JSON object of a structured answer: the whole answer (a reasoning model's ``<think>`` block removed, a
    single surrounding ```json fence allowed); prose around it is an error, never searched.

    Raises:
        RuleSyntaxError: not one JSON object.
    """
    if not isinstance(text, str):
        raise RuleSyntaxError(f"the answer is not text: {type(text).__name__}")
    if len(text) > MAX_JSON_CHARS:
        raise RuleSyntaxError(f"the answer is longer than {MAX_JSON_CHARS} characters")
    t = _THINK_BLOCK.sub("", text).strip()
    m = _JSON_FENCE.match(t)
    if m:
        t = m.group(1).strip()
    try:
        return json.loads(t)
    except (json.JSONDecodeError, RecursionError) as exc:
        raise RuleSyntaxError(f"the answer is not one JSON object: {exc}"[:200]) from None


def _accepts(fn: Any, kw: str) -> bool:
    import inspect

    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    return kw in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


class LLMSynthesizer:
    """Rule text from an LLM, parsed (never executed); the template when the answer does not parse or validate."""

    name = "llm"

    def __init__(self, llm: LLMClient, fallback: Any = None, *, structured: bool = True):
        self.llm, self.structured = llm, structured
        self.fallback = fallback if fallback is not None else TemplateSynthesizer()
        self.failures: list[str] = []

    def synthesize(self, inc: Incident, rule: Rule, evaluator: Evaluator) -> Rule | None:
        env = pre_action_env(inc)
        if env is None or env.get("call") is None:
            return self.fallback.synthesize(inc, rule, evaluator)
        preds = ", ".join(sorted(p for p in registered_predicates() if p != "semantic"))
        task = env["ctx"].get("user_task", "")
        try:
            if self.structured:
                # structured output: the answer is one JSON object following RULE_SCHEMA (no prose is parsed)
                prompt = STRUCTURED_PROMPT.format(rule=rule.to_text(), call=env["call"], task=task,
                                                  schema=json.dumps(RULE_SCHEMA), predicates=preds)
                kw: dict[str, Any] = {"max_tokens": 1024}
                if _accepts(self.llm.complete, "response_format"):
                    kw["response_format"] = {"type": "json_schema",
                                             "json_schema": {"name": "air_rule", "schema": RULE_SCHEMA}}
                text = self.llm.complete([{"role": "user", "content": prompt}], **kw).text
                r = rule_from_json(json_from_answer(text))
            else:
                prompt = PROMPT.format(rule=rule.to_text(), call=env["call"], task=task, predicates=preds)
                text = self.llm.complete([{"role": "user", "content": prompt}]).text
                r = rule_from_answer(text)
            return Rule(name=f"{rule.name}__llm", triggers=r.triggers, detect=r.detect, when=r.when,
                        severity=rule.severity, contain=r.contain, provenance=self.name)
        except (LLMError, RuleSyntaxError, ValueError) as exc:
            self.failures.append(f"{type(exc).__name__}: {exc}")
            fb = self.fallback.synthesize(inc, rule, evaluator)
            return None if fb is None else Rule(**{**fb.__dict__, "provenance": f"{self.name}->template"})


_FENCE = re.compile(r"```[a-zA-Z]*\n(.*?)```", re.S)
_BLOCK = re.compile(r"^[ \t]*rule[ \t]+[A-Za-z_]\w*.*?^[ \t]*end[ \t]*$", re.S | re.M)


def rule_from_answer(text: str) -> Rule:
    r"""The one rule in an LLM's answer: the first fenced block or ``rule ... end`` block (line-anchored, so prose
    before or after it, which may itself say "rule", is skipped) that parses to exactly one rule.

    Raises:
        RuleSyntaxError: no block parses (the last parse error, or "no rule ... end block").

    Example:
        >>> rule_from_answer("Here is the rule you need:\nrule r on before_action(x)\ndetect\n  : call.args.a == 1\n"
        ...                  "contain\n  - block\nend\nThis rule blocks it.").name
        'r'
    """
    candidates = [m.group(1) for m in _FENCE.finditer(text)] + [m.group(0) for m in _BLOCK.finditer(text)]
    error: RuleSyntaxError = RuleSyntaxError("no rule ... end block in the answer")
    for c in candidates:
        try:
            parsed = parse(c, file="<llm>")
        except RuleSyntaxError as exc:
            error = exc
            continue
        if len(parsed) == 1:
            return parsed[0]
        error = RuleSyntaxError(f"expected one rule, got {len(parsed)}")
    raise error
