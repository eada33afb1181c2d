"""AIR's dsl layer, the grammar and parser: rule text to the AST (lark LALR, positioned errors, limits)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from ..core.errors import RuleSyntaxError
from ..core.regex import compile_regex
from .checks import RuleSchema, _semantic_errors, schema_errors, with_manifest
from .nodes import ROOTS, Action, Cond, Eradicate, ListExpr, Lit, Path_, PredicateDef, Rule, RuleSet, Trigger

GRAMMAR = r"""
start: item*
?item: rule_def | predicate_def

rule_def: "rule" NAME meta* "on" trigger when? detect contain? recover? eradicate? "end"
meta: "severity" SEVERITY        -> severity
    | "priority" SIGNED_INT      -> priority
    | "tags" "[" [NAME ("," NAME)*] "]" -> tags
    | "fail" FAILMODE                -> fail
trigger: event ("|" event)*
event: PHASE ["(" GLOB ("|" GLOB)* ")"]
when: "when" cond
detect: "detect" detect_line+ confirm?
detect_line: ":" cond
confirm: "confirm" "by" CONFIRMER
contain: "contain" action_line+
recover: "recover" action_line+ verify?
verify: "verify" cond
action_line: "-" action
?action: ENFORCEMENT             -> enforce
       | GLOB "(" [kwarg ("," kwarg)*] ")" -> tool_action
       | "guide" STRING          -> guide
       | "undo"                  -> undo
kwarg: NAME "=" expr
eradicate: "eradicate" erad_opt+
?erad_opt: "synthesize" "rule" ["from" NAME] -> synthesize
         | "scope" GLOB                      -> scope
         | "validate" "on" NAME              -> validate
         | "max_predicates" SIGNED_INT       -> max_predicates

predicate_def: "predicate" NAME "(" [NAME ("," NAME)*] ")" ":" cond

?cond: or_cond
?or_cond: and_cond ("or" and_cond)*      -> or_
?and_cond: not_cond ("and" not_cond)*    -> and_
?not_cond: "not" not_cond                -> not_
         | atom
?atom: expr CMP expr                     -> compare
     | expr "matches" STRING             -> matches
     | expr "in" expr                    -> in_
     | "semantic" "(" STRING ("," expr)* ")" -> semantic
     | QUANT "(" NAME "in" expr ":" cond ")" -> quantifier
     | NAME "(" [expr ("," expr)*] ")"   -> pred_call
     | "(" cond ")"

?expr: path | literal | list
path: NAME (("." NAME) | ("[" expr "]"))*
list: "[" [expr ("," expr)*] "]"
literal: STRING -> string
       | SIGNED_NUMBER -> number
       | "true" -> true
       | "false" -> false
       | "null" -> null

SEVERITY: "low" | "medium" | "high" | "critical"
FAILMODE: "closed" | "open"
PHASE.2: "before_step" | "before_action" | "after_action" | "state_change" | "finish"
CONFIRMER: "llm" | "user" | "rule_only"
ENFORCEMENT.2: "block" | "stop" | "skip" | "ask_user" | "self_reflect" | "quarantine_tool" | "snapshot" | "alert"
QUANT.3: /(any|all)\b/
CMP: "==" | "!=" | "<=" | ">=" | "<" | ">"
NAME: /[A-Za-z_][A-Za-z0-9_]*/
GLOB: /[A-Za-z_*][A-Za-z0-9_.*]*/
STRING: /"(?:[^"\\\n]|\\.)*"/

%import common.SIGNED_INT
%import common.SIGNED_NUMBER
%import common.WS
%ignore WS
COMMENT: /#[^\n]*/
%ignore COMMENT
"""


MAX_TEXT_CHARS = 1_000_000      # a rule file larger than this is refused (rule files are hand-written)
MAX_NESTING = 32                # brackets and parentheses nested deeper than this are refused
MAX_TREE_DEPTH = 200            # conditions nested deeper (``not not ...`` chains included) are refused


def _check_limits(text: str, file: str) -> None:
    """Size and bracket-nesting limits, checked before parsing (positioned errors, no RecursionError)."""
    if len(text) > MAX_TEXT_CHARS:
        raise RuleSyntaxError(f"rule text of {len(text)} characters exceeds the limit of {MAX_TEXT_CHARS}",
                              file=file, line=1, column=1)
    depth, line, col, in_str, esc, comment = 0, 1, 0, False, False, False
    for ch in text:
        col += 1
        if ch == "\n":
            line, col, comment, in_str = line + 1, 0, False, False
            continue
        if comment:
            continue
        if in_str:
            esc = not esc and ch == "\\"
            if ch == '"' and not esc:
                in_str = False
            continue
        if ch == '"':
            in_str, esc = True, False
        elif ch == "#":
            comment = True
        elif ch in "([":
            depth += 1
            if depth > MAX_NESTING:
                raise RuleSyntaxError(f"brackets nested deeper than {MAX_NESTING} levels", file=file, line=line,
                                      column=col)
        elif ch in ")]":
            depth = max(depth - 1, 0)


def _check_depth(tree: Any, file: str) -> None:
    """The parse tree's depth, measured without recursion (``not not ...`` chains are deep without brackets)."""
    from lark import Tree

    stack = [(tree, 1)]
    while stack:
        node, d = stack.pop()
        if d > MAX_TREE_DEPTH:
            meta = getattr(node, "meta", None)
            raise RuleSyntaxError(f"conditions nested deeper than {MAX_TREE_DEPTH} levels", file=file,
                                  line=getattr(meta, "line", 0), column=getattr(meta, "column", 0))
        stack += [(c, d + 1) for c in node.children if isinstance(c, Tree)]


# ------------------------------------------------------------------------------------------------- parsing
_PARSER = None


def _parser() -> Any:
    global _PARSER
    if _PARSER is None:
        from ...common.optional import requires

        lark = requires("lark", extra="agents", purpose="the AIR rule language")
        _PARSER = lark.Lark(GRAMMAR, parser="lalr", maybe_placeholders=False, propagate_positions=True)
    return _PARSER


def _unquote(token: Any, file: str = "<rules>") -> str:
    """A string token's value (JSON escapes); a control character, a bad escape or a lone surrogate in it is a
    positioned :class:`RuleSyntaxError` at the token."""
    text = str(token)
    if not text.startswith('"'):
        return text
    line, column = getattr(token, "line", 0) or 0, getattr(token, "column", 0) or 0
    try:
        value = json.loads(text)
    except ValueError as exc:   # json.JSONDecodeError: exc.pos is the offset inside the token (no newline in it)
        pos = getattr(exc, "pos", 0) or 0
        bad = text[pos] if pos < len(text) else ""
        if bad != "\\" and text[pos - 1:pos] == "\\":     # a bad escape: at its backslash
            pos, bad = pos - 1, "\\"
        what = (f"control character {bad!r} in a string (write it as an escape, e.g. \\t or \\u0001)"
                if bad and ord(bad) < 0x20 else f"bad escape in a string: {exc.msg}")
        raise RuleSyntaxError(what, file=file, line=line, column=column + pos) from None
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise RuleSyntaxError(f"string holds a lone surrogate (U+{ord(value[exc.start]):04X}), not valid Unicode",
                              file=file, line=line, column=column) from None
    return value


MAX_INT_DIGITS = 4000           # an integer literal with more digits is refused (Python's own limit is 4300)


def _number(token: Any, file: str, *, integer: bool = False) -> int | float:
    """A number token's value: an integer of at most :data:`MAX_INT_DIGITS` digits or a finite float."""
    s = str(token)
    where = {"file": file, "line": getattr(token, "line", 0) or 0, "column": getattr(token, "column", 0) or 0}
    if integer or not any(ch in s for ch in ".eE"):
        digits = len(s.lstrip("+-"))
        if digits > MAX_INT_DIGITS:
            raise RuleSyntaxError(f"integer of {digits} digits exceeds the limit of {MAX_INT_DIGITS}", **where)
        return int(s)
    value = float(s)
    if not math.isfinite(value):
        raise RuleSyntaxError(f"number {s[:40]}{'...' if len(s) > 40 else ''} is out of range (not a finite float)",
                              **where)
    return value


def _build(tree: Any, file: str) -> RuleSet:
    from lark import Token, Tree

    def expr(t: Any) -> Any:
        if isinstance(t, Token):
            raise RuleSyntaxError(f"unexpected token {t!s}", file=file, line=t.line, column=t.column)
        d = t.data
        if d == "path":
            root, parts = str(t.children[0]), []
            for c in t.children[1:]:
                parts.append(str(c) if isinstance(c, Token) else expr(c))
            return Path_(root, tuple(parts))
        if d == "string":
            return Lit(_unquote(t.children[0], file))
        if d == "number":
            return Lit(_number(t.children[0], file))
        if d in ("true", "false", "null"):
            return Lit({"true": True, "false": False, "null": None}[d])
        if d == "list":
            return ListExpr(tuple(expr(c) for c in t.children if c is not None))
        raise RuleSyntaxError(f"expected an expression, found {d}", file=file, line=t.meta.line, column=t.meta.column)

    def cond(t: Any) -> Cond:
        d = t.data if isinstance(t, Tree) else None
        if d in ("or_", "and_"):
            if len(t.children) == 1:
                return cond(t.children[0])
            return Cond(d.rstrip("_"), tuple(cond(c) for c in t.children))
        if d == "not_":
            return Cond("not", (cond(t.children[0]),))
        if d == "compare":
            return Cond("compare", (expr(t.children[0]), expr(t.children[2])), cmp=str(t.children[1]))
        if d == "matches":
            pattern = _unquote(t.children[1], file)
            try:
                compile_regex(pattern)
            except ValueError as exc:
                tok = t.children[1]
                raise RuleSyntaxError(f"bad regular expression {pattern[:80]!r}: {exc}", file=file, line=tok.line,
                                      column=tok.column) from None
            return Cond("matches", (expr(t.children[0]), Lit(pattern)))
        if d == "in_":
            return Cond("in", (expr(t.children[0]), expr(t.children[1])))
        if d == "semantic":
            return Cond("semantic", (Lit(_unquote(t.children[0], file)), *(expr(c) for c in t.children[1:])))
        if d == "quantifier":
            var = str(t.children[1])
            if var in ROOTS:
                tok = t.children[1]
                raise RuleSyntaxError(f"the quantifier variable {var!r} hides the root of the same name", file=file,
                                      line=tok.line, column=tok.column)
            return Cond(str(t.children[0]), (var, expr(t.children[2]), cond(t.children[3])))
        if d == "pred_call":
            return Cond("pred", (str(t.children[0]), *(expr(c) for c in t.children[1:] if c is not None)))
        line, col = (t.meta.line, t.meta.column) if isinstance(t, Tree) else (t.line, t.column)
        raise RuleSyntaxError("expected a condition (comparison, matches, in, semantic(...) or a predicate call), "
                              "found an expression", file=file, line=line, column=col)

    def action(t: Any) -> Action:
        if t.data == "undo":
            return Action("undo")
        if t.data == "enforce":
            return Action(str(t.children[0]))
        if t.data == "guide":
            return Action("guide", text=_unquote(t.children[0], file))
        kwargs = tuple((str(k.children[0]), expr(k.children[1])) for k in t.children[1:] if k is not None)
        return Action("tool", tool=str(t.children[0]), kwargs=kwargs)

    rules, macros = [], {}
    for item in tree.children:
        if item.data == "predicate_def":
            name = str(item.children[0])
            params = tuple(str(c) for c in item.children[1:-1] if c is not None)
            macros[name] = PredicateDef(name, params, cond(item.children[-1]))
            continue
        kw: dict[str, Any] = {"name": str(item.children[0]), "line": item.meta.line}
        tags: list[str] = []
        for part in item.children[1:]:
            if isinstance(part, Token):
                continue
            d = part.data
            if d == "severity":
                kw["severity"] = str(part.children[0])
            elif d == "priority":
                kw["priority"] = _number(part.children[0], file, integer=True)
            elif d == "tags":
                tags += [str(c) for c in part.children if c is not None]
            elif d == "fail":
                kw["fail"] = str(part.children[0])
            elif d == "trigger":
                kw["triggers"] = tuple(Trigger(str(e.children[0]), tuple(str(g) for g in e.children[1:] if g is not None))
                                       for e in part.children)
            elif d == "when":
                kw["when"] = cond(part.children[0])
            elif d == "detect":
                kw["detect"] = tuple(cond(c.children[0]) for c in part.children if c.data == "detect_line")
                for c in part.children:
                    if c.data == "confirm":
                        kw["confirm"] = str(c.children[0])
            elif d == "contain":
                kw["contain"] = tuple(action(c.children[0]) for c in part.children)
            elif d == "recover":
                kw["recover"] = tuple(action(c.children[0]) for c in part.children if c.data == "action_line")
                for c in part.children:
                    if c.data == "verify":
                        kw["verify"] = cond(c.children[0])
            elif d == "eradicate":
                e: dict[str, Any] = {}
                for opt in part.children:
                    if opt.data == "synthesize":
                        e["synthesize"] = True
                        e["source"] = str(opt.children[0]) if opt.children else ""
                    elif opt.data == "scope":
                        e["scope"] = str(opt.children[0])
                    elif opt.data == "validate":
                        e["validate_on"] = str(opt.children[0])
                    elif opt.data == "max_predicates":
                        e["max_predicates"] = _number(opt.children[0], file, integer=True)
                kw["eradicate"] = Eradicate(**e)
        kw["tags"] = tuple(tags)
        rules.append(Rule(**kw))
    return RuleSet(rules, macros)


def _expected(exc: Any) -> str:
    exp = sorted(getattr(exc, "expected", None) or getattr(exc, "allowed", None) or [])
    names = {"NAME": "a name", "GLOB": "a tool name", "STRING": "a string", "PHASE": "a phase", "SIGNED_INT": "an int",
             "SIGNED_NUMBER": "a number", "CMP": "a comparison", "ENFORCEMENT": "an enforcement action",
             "SEVERITY": "a severity", "CONFIRMER": "llm, user or rule_only"}
    shown = [names.get(e, e.strip('"').lower()) for e in exp][:8]
    return ", ".join(dict.fromkeys(shown)) or "something else"


def parse(text: str, *, file: str = "<rules>", check: bool = True, manifest: Any = None) -> RuleSet:
    """Parse rule text. ``check`` also validates names, predicates, paths and regexes (see :func:`lint`); with a
    tool ``manifest`` (:class:`~icml26.air.policy.manifest.Manifest`) it also refuses what cannot fire: trigger
    and contain/recover tools the manifest does not declare, ``call.args.X`` that no tool the trigger matches
    declares, and ``state.X`` outside the state keys it declares (see :func:`~icml26.air.dsl.lint.lint`).

    Any text gives a :class:`RuleSyntaxError` or rules, never another exception.

    Raises:
        RuleSyntaxError: with file, line, column and what was expected.
    """
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    from lark.exceptions import UnexpectedCharacters, UnexpectedEOF, UnexpectedInput, UnexpectedToken

    _check_limits(text, file)
    try:
        tree = _parser().parse(text)
    except UnexpectedToken as exc:
        found = "end of file" if exc.token.type == "$END" else repr(str(exc.token))
        raise RuleSyntaxError(f"unexpected {found}; expected {_expected(exc)}", file=file, line=exc.line,
                              column=exc.column) from None
    except UnexpectedCharacters as exc:
        ch = text[exc.pos_in_stream]
        what = ("unterminated string (a string ends with \" on its own line)" if ch == '"' else
                f"unexpected character {ch!r}; expected {_expected(exc)}")
        raise RuleSyntaxError(what, file=file, line=exc.line, column=exc.column) from None
    except UnexpectedEOF as exc:
        raise RuleSyntaxError(f"unexpected end of file; expected {_expected(exc)}", file=file,
                              line=text.count("\n") + 1, column=0) from None
    except UnexpectedInput as exc:  # pragma: no cover - other lark errors
        raise RuleSyntaxError(str(exc), file=file, line=getattr(exc, "line", 0),
                              column=getattr(exc, "column", 0)) from None
    _check_depth(tree, file)
    try:
        rules = _build(tree, file)
    except RecursionError:  # pragma: no cover - the depth limits above come first
        raise RuleSyntaxError("rule nested too deeply", file=file, line=1, column=1) from None
    if check:
        problems = _semantic_errors(rules)
        if manifest is not None:   # whether a semantic(...) backend will be configured is not the file's concern
            problems += schema_errors(rules, with_manifest(RuleSchema(semantic=True), manifest))
        if problems:
            line, message = problems[0]
            raise RuleSyntaxError(message, file=file, line=line, column=1)
    return rules


def read_rule_text(path: str | Path) -> str:
    """A rule file's text; a file that is not UTF-8 (or too large) raises a positioned :class:`RuleSyntaxError`."""
    p = Path(path)
    with open(p, "rb") as f:
        data = f.read(MAX_TEXT_CHARS * 4 + 1)
    if len(data) > MAX_TEXT_CHARS * 4:
        raise RuleSyntaxError(f"rule file larger than {MAX_TEXT_CHARS * 4} bytes", file=str(p), line=1, column=1)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        head = data[:exc.start]
        line = head.count(b"\n") + 1
        column = exc.start - (head.rfind(b"\n") + 1) + 1
        raise RuleSyntaxError(f"not UTF-8: byte 0x{data[exc.start]:02x} cannot be decoded", file=str(p), line=line,
                              column=column) from None


def load(path: str | Path, **kwargs: Any) -> RuleSet:
    """Parse a rule file (keyword arguments go to :func:`parse`, ``manifest=`` among them)."""
    return parse(read_rule_text(path), file=str(path), **kwargs)
