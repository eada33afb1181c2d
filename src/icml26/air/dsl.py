"""The AIR rule language: a declarative incident-response lifecycle per rule, parsed with lark, never executed.

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
tool manifest, arguments bound from the call and the state diff: ``manifest.py``); ``verify cond``; eradicate = ``synthesize rule [from NAME]``,
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

import fnmatch
import functools
import json
import re
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PHASES = ("before_step", "before_action", "after_action", "state_change", "finish")
ENFORCEMENTS = ("block", "stop", "skip", "ask_user", "self_reflect", "quarantine_tool", "snapshot", "alert")
SEVERITIES = ("low", "medium", "high", "critical")
ROOTS = ("call", "result", "state", "snap", "ctx", "incident")

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


class CheckError(RuntimeError):
    """A check that cannot be decided (no semantic backend, an LLM that fails or answers neither yes nor no)."""


class RuleSyntaxError(ValueError):
    """A rule file that does not parse or does not validate: ``file:line:column: message``."""

    def __init__(self, message: str, *, file: str = "<rules>", line: int = 0, column: int = 0):
        self.file, self.line, self.column, self.detail = file, line, column, message
        super().__init__(f"{file}:{line}:{column}: {message}")


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


# ------------------------------------------------------------------------------------------------ predicates
_PREDICATES: dict[str, Callable[..., bool]] = {}


def predicate(name: str) -> Callable[[Callable[..., bool]], Callable[..., bool]]:
    """Register a Python predicate under ``name`` (rule files call it; they never contain code).

    Example:
        >>> @predicate("is_even")
        ... def _is_even(x):
        ...     return x % 2 == 0
        >>> "is_even" in registered_predicates()
        True
    """
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name) or name in ("semantic", "not", "and", "or"):
        raise ValueError(f"invalid predicate name {name!r}")

    def register(fn: Callable[..., bool]) -> Callable[..., bool]:
        _PREDICATES[name] = fn
        return fn

    return register


def registered_predicates() -> dict[str, Callable[..., bool]]:
    return dict(_PREDICATES)


# ------------------------------------------------------------------------------------------------- limits
MAX_TEXT_CHARS = 1_000_000      # a rule file larger than this is refused (rule files are hand-written)
MAX_NESTING = 32                # brackets and parentheses nested deeper than this are refused
MAX_TREE_DEPTH = 200            # conditions nested deeper (``not not ...`` chains included) are refused
MAX_REGEX_CHARS = 2_000         # a ``matches`` pattern longer than this is refused
MAX_QUANT_ITEMS = 100_000       # any(...)/all(...) over a larger collection errs (the rule's fail policy decides)
QUANTIFIERS = ("any", "all")


def compile_regex(pattern: str) -> Any:
    """Compile ``pattern`` with RE2, a linear-time engine: no backtracking, so no rule can hang a hook.

    RE2 refuses backreferences and look-around; ``\\w``, ``\\d`` and ``\\b`` are ASCII. Compiled patterns are cached.

    Raises:
        ValueError: the pattern is too long or RE2 cannot compile it (the message says why).

    Example:
        >>> compile_regex(r"^(a+)+$").search("a" * 10_000 + "b") is None
        True
    """
    if not isinstance(pattern, str):
        raise TypeError(f"pattern must be a str, got {type(pattern).__name__}")
    if len(pattern) > MAX_REGEX_CHARS:
        raise ValueError(f"regular expression longer than {MAX_REGEX_CHARS} characters")
    return _compile_re2(pattern)


def findall_utf8(pattern: str, text: str) -> list[str]:
    """``compile_regex(pattern).findall(text)`` for a pattern without capturing groups, matched on the UTF-8 bytes
    (RE2 matches ``str`` in UTF-8 too, so the matches are the same; see :func:`spans_utf8`). ``text`` must encode
    as UTF-8.

    Example:
        >>> findall_utf8(r"\\w+@\\w+\\.io", "Zoë wrote: mail eve@evil.io")
        ['eve@evil.io']
    """
    b = text.encode()
    return [b[i:j].decode() for i, j in spans_utf8(pattern, b)]


def spans_utf8(pattern: str, data: bytes) -> Iterator[tuple[int, int]]:
    """The ``(start, end)`` byte offsets of the successive non-overlapping matches of ``pattern`` (compiled with RE2,
    as :func:`compile_regex`) in UTF-8 ``data``, leftmost first, as ``finditer`` finds them.

    The binding's ``finditer`` builds a match object per match (and on ``str`` converts character and byte offsets
    at every match), which cost more than the matching itself on AgentDojo's tool outputs (issue #36 item 7); this
    loop asks RE2 for the next match's span directly. A test compares it with the binding's ``finditer``.

    Example:
        >>> list(spans_utf8(r"\\d+", "a1 bb22 ë333".encode()))
        [(1, 2), (5, 7), (10, 13)]
    """
    if len(pattern) > MAX_REGEX_CHARS:
        raise ValueError(f"regular expression longer than {MAX_REGEX_CHARS} characters")
    rx = _compile_re2(pattern.encode())
    step = getattr(getattr(rx, "_regexp", None), "Match", None)
    anchor = getattr(getattr(sys.modules.get("re2"), "_Anchor", None), "UNANCHORED", None)
    if step is None or anchor is None:          # another binding version: its own (slower) iterator
        yield from (m.span() for m in rx.finditer(data))
        return
    pos, end = 0, len(data)
    while True:                                  # the binding's loop on str, without its match objects
        i, j = step(anchor, data, pos, end)[0]
        if i < 0:
            return
        yield i, j
        if pos == end:
            return
        if pos == j:                             # an empty match at pos: move on by one character
            pos += 1
            while pos < end and data[pos] & 0xC0 == 0x80:
                pos += 1
        else:
            pos = j


@functools.lru_cache(maxsize=4096)
def _compile_re2(pattern: str | bytes) -> Any:
    from ..common.optional import requires

    re2 = requires("re2", extra="agents", purpose="linear-time regular expressions in AIR rules")
    options = re2.Options()
    options.log_errors = False
    try:
        return re2.compile(pattern, options)
    except re2.error as exc:
        detail = exc.args[0].decode() if exc.args and isinstance(exc.args[0], bytes) else str(exc)
        raise ValueError(f"not supported by the linear-time regex engine (RE2): {detail}") from None


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
        from ..common.optional import requires

        lark = requires("lark", extra="agents", purpose="the AIR rule language")
        _PARSER = lark.Lark(GRAMMAR, parser="lalr", maybe_placeholders=False, propagate_positions=True)
    return _PARSER


def _unquote(token: str) -> str:
    return json.loads(token) if token.startswith('"') else token


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
            return Lit(_unquote(str(t.children[0])))
        if d == "number":
            s = str(t.children[0])
            return Lit(float(s) if any(ch in s for ch in ".eE") else int(s))
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
            pattern = _unquote(str(t.children[1]))
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
            return Cond("semantic", (Lit(_unquote(str(t.children[0]))), *(expr(c) for c in t.children[1:])))
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
            return Action("guide", text=_unquote(str(t.children[0])))
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
                kw["priority"] = int(part.children[0])
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
                        e["max_predicates"] = int(opt.children[0])
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


def parse(text: str, *, file: str = "<rules>", check: bool = True) -> RuleSet:
    """Parse rule text. ``check`` also validates names, predicates, paths and regexes (see :func:`lint`).

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
        raise RuleSyntaxError(f"unexpected character {text[exc.pos_in_stream]!r}; expected {_expected(exc)}",
                              file=file, line=exc.line, column=exc.column) from None
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
    """Parse a rule file (keyword arguments go to :func:`parse`)."""
    return parse(read_rule_text(path), file=str(path), **kwargs)


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
    """Evaluates conditions; ``semantic`` is called for ``semantic(...)`` checks (None: they are False)."""

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
                self.errors.append(f"cannot compare {a!r} {c.cmp} {b!r}")
                return False
        if op == "matches":
            v = resolve(c.args[0], env)
            return v is not MISSING and compile_regex(c.args[1].value).search(
                v if isinstance(v, str) else json.dumps(v, default=str)) is not None
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
            return bool(self.semantic(c.args[0].value, args, env))
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


def _items(coll: Any) -> list[Any] | None:
    if isinstance(coll, Mapping):
        return [{**v, "key": k} if isinstance(v, Mapping) and "key" not in v else v for k, v in coll.items()]
    if isinstance(coll, list | tuple | set | frozenset):
        return list(coll)
    return None


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
