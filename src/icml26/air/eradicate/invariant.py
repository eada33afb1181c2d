"""AIR's eradicate layer, the state-invariant template: a prevention rule from the checks that hold only *after*
the incident's call, checked before a call on the state that call is predicted to leave (issue #49 item 5).

The pre-state template (:mod:`.template`) keeps the incident rule's checks that already held before the harmful
call. A state invariant (a burner on with nothing on it, a flammable object on a burner that is on) is false
before the call that breaks it and true after, so that template drops it and falls back to the call's constant
arguments, which no later incident of the family repeats. Here the rule's checks are run on the state *after*
the call instead, predicted before the call:

1. :func:`call_effects` learns what the incident's call did to the state from its own state diff, lifted to the
   call's arguments: a field of the record an argument names (``state.objects[call.args.object].isToggled``) set
   to a constant or to another argument's value, or a list field that gained or lost one such value. Every other
   change (a record no argument names, a sensor the environment derives, a record added or removed) is opaque.
2. :func:`post_condition` turns a check on the post-action state into a check on the pre-action state, the
   weakest precondition of the learned assignment: for an effect ``state.C[l].F := v`` (``l`` the call's
   argument) each read ``state.C[e].F`` of the check :math:`Q` is split on whether it is the record written,
   :math:`wp(Q) = (e = l \\wedge Q[v]) \\vee (e \\ne l \\wedge Q)`; a check that reads an opaque change cannot
   be predicted (None).
3. :func:`post_state_rule` keeps the result only when some check of the incident rule held after the call and
   not before (a broken invariant), adds that the invariant did not already hold (the call is the one that breaks
   it), and writes ``before_action(<tool>) ... contain - block``: an ordinary prevention rule that the validator
   replays and tests on benign traces like any other.

Why before the action, with a predicted post-state, and not after it with ``undo``: eradicated rules must be
prevention-only (``before_action`` + ``block``, :meth:`~icml26.air.dsl.Rule.is_prevention`), so they cannot
widen what is allowed; the embedded worlds count a harm that happened and was undone as harm (eradication is "the
harm never happens"); and the tool manifests declare effect classes and inverse operations, not state
transitions, so the transition is learned from the incident itself. The learned effect is the tool's effect on
the records its arguments name: a change the environment derives from other state (a microwave that sparks only
with metal inside) is predicted for every call of the tool, and the validator's benign traces reject the rules
that over-predict. End-of-episode invariants (an appliance *left* on, a ``finish`` rule) are not covered: the
violation is a call that never comes, and the calls before it are those of a benign episode that turns the
appliance off later.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..core.errors import RuleSyntaxError
from ..core.records import Incident
from ..dsl import Action, Cond, Evaluator, ListExpr, Lit, Path_, Rule, Trigger, count_checks, parse
from ..dsl.evaluator import _CMP
from ..runtime.containment import holds_before, pre_action_env, pre_action_safe

#: what a learned effect does to its location (see :class:`Effect`)
EFFECT_KINDS = ("set", "append", "remove", "opaque")
#: alias splits one check may take (each doubles a read): a check that needs more is not predicted (None)
MAX_SPLITS = 64
_ABSENT = object()


@dataclass(frozen=True)
class Effect:
    """One change the incident's call made to the state, lifted to the call's arguments.

    ``state.<collection>[call.args.<arg>].<field>`` is set to ``value`` (``set``), gains or loses ``value`` (a
    list field: ``append``, ``remove``), or changed in a way that cannot be predicted (``opaque``). ``arg`` None:
    a record no argument names (``opaque`` only); ``field`` None: the top-level value ``state.<collection>``
    itself changed, or one of its records was added or removed (``opaque`` only).

    Example:
        >>> Effect("objects", "object", "isToggled", "set", Lit(True)).kind
        'set'
    """

    collection: str
    arg: str | None
    field: str | None
    kind: str
    value: Any = None

    def __post_init__(self) -> None:
        if self.kind not in EFFECT_KINDS:
            raise ValueError(f"kind must be one of {EFFECT_KINDS}, got {self.kind!r}")
        if not isinstance(self.collection, str) or not self.collection:
            raise TypeError(f"collection must be a non-empty str, got {self.collection!r}")
        if self.kind != "opaque" and (self.arg is None or self.field is None):
            raise ValueError(f"a {self.kind} effect needs arg and field (a record an argument names)")
        if self.kind != "opaque" and not isinstance(self.value, Lit | Path_):
            raise TypeError(
                f"value of a {self.kind} effect must be a Lit or a call.args path, got {self.value!r}"
            )


class _Unpredictable(Exception):
    """A check reads something the learned effect changes in a way it cannot predict."""


# ------------------------------------------------------------------------------------------- learned effects
def call_effects(call: Mapping[str, Any], pre: Mapping[str, Any], post: Mapping[str, Any]) -> list[Effect]:
    """The changes from ``pre`` to ``post`` (the state before and after the incident's call), lifted to the call.

    A record of a top-level collection of records (``state.objects``) that a call argument names (the argument's
    string value is its key) has each changed field learned as ``set`` to the new value, ``append``/``remove``
    when a list gained or lost one element; a value equal to an argument's value is lifted to
    ``call.args.<name>`` (the object put becomes *whatever the call puts*), any other scalar stays a literal,
    and anything else is ``opaque``, as is every change the call's arguments do not name.

    Args:
        call: the call's view (``{"name": ..., "args": {...}}``).
        pre: the state before the call.
        post: the state after it.

    Returns:
        the effects, in the order of the state's keys, the records' keys and the fields (sorted).

    Example:
        >>> from icml26.air.dsl import expr_text
        >>> pre = {"objects": {"Pan": {"on": "Table"}, "Stove": {"contents": []}}, "log": []}
        >>> post = {"objects": {"Pan": {"on": "Stove"}, "Stove": {"contents": ["Pan"]}}, "log": ["put"]}
        >>> call = {"name": "robot.put", "args": {"object": "Pan", "receptacle": "Stove"}}
        >>> [(e.collection, e.arg, e.field, e.kind, e.value and expr_text(e.value)) for e in call_effects(call, pre, post)]
        [('log', None, None, 'opaque', None), ('objects', 'object', 'on', 'set', 'call.args.receptacle'), ('objects', 'receptacle', 'contents', 'append', 'call.args.object')]
    """
    if not isinstance(call, Mapping) or not isinstance(call.get("args", {}), Mapping):
        raise TypeError(f"call must be a call view mapping with an 'args' mapping, got {type(call).__name__}")
    for name, value in (("pre", pre), ("post", post)):
        if not isinstance(value, Mapping):
            raise TypeError(f"{name} must be a state mapping, got {type(value).__name__}")
    args = {k: v for k, v in sorted(call.get("args", {}).items()) if isinstance(k, str) and k.isidentifier()}
    out: list[Effect] = []
    for top in sorted({*pre, *post}, key=str):
        a, b = pre.get(top, _ABSENT), post.get(top, _ABSENT)
        if a == b or not isinstance(top, str):
            continue
        if not (_records(a) and _records(b)):
            out.append(Effect(top, None, None, "opaque"))  # a derived view, a list, a scalar: not predicted
            continue
        if set(a) != set(b):
            out.append(Effect(top, None, None, "opaque"))  # records added or removed: the domain changed
        for key in sorted(set(a) & set(b), key=str):
            ra, rb = a[key], b[key]
            if ra == rb:
                continue
            names = [k for k, v in args.items() if isinstance(v, str) and v == key]
            for f in sorted({*ra, *rb}, key=str):
                va, vb = ra.get(f, _ABSENT), rb.get(f, _ABSENT)
                if va == vb or not isinstance(f, str):
                    continue
                if not names:
                    out.append(Effect(top, None, f, "opaque"))  # a record the call does not name
                    continue
                out.append(_field_effect(top, names[0], f, va, vb, args))
    return _unique(out)


def _records(v: Any) -> bool:
    """Whether ``v`` is a collection of records (a mapping whose values are all mappings, not empty)."""
    return isinstance(v, Mapping) and bool(v) and all(isinstance(r, Mapping) for r in v.values())


def _lifted(v: Any, args: Mapping[str, Any]) -> Lit | Path_ | None:
    """``call.args.<name>`` when ``v`` is the value of an argument, a literal for another scalar, else None."""
    if isinstance(v, str):
        for k, a in args.items():
            if a == v:
                return Path_("call", ("args", k))
    if v is None or isinstance(v, str | bool | int | float):
        return Lit(v)
    return None


def _field_effect(coll: str, arg: str, field: str, old: Any, new: Any, args: Mapping[str, Any]) -> Effect:
    if new is _ABSENT:
        return Effect(coll, arg, field, "opaque")  # a field removed
    if isinstance(old, list) and isinstance(new, list) and abs(len(new) - len(old)) == 1:
        longer, shorter, kind = (new, old, "append") if len(new) > len(old) else (old, new, "remove")
        for i, item in enumerate(longer):
            if longer[:i] + longer[i + 1 :] == shorter:
                value = _lifted(item, args)
                return (
                    Effect(coll, arg, field, kind, value)
                    if value is not None
                    else Effect(coll, arg, field, "opaque")
                )
        return Effect(coll, arg, field, "opaque")
    value = _lifted(new, args)
    return Effect(coll, arg, field, "set", value) if value is not None else Effect(coll, arg, field, "opaque")


def _unique(effects: list[Effect]) -> list[Effect]:
    """The effects in order, each once (an opaque change repeats once per record no argument names)."""
    seen, out = set(), []
    for e in effects:
        if e not in seen:
            seen.add(e)
            out.append(e)
    return out


# ------------------------------------------------------------------------------------- weakest precondition
def post_condition(
    cond: Cond, effects: Sequence[Effect], *, macros: Mapping[str, Any] = ()
) -> Cond | bool | None:
    """A check on the pre-action state that holds exactly when ``cond`` holds on the state after a call with
    ``effects``: the weakest precondition of the assignment (Hoare's axiom, :math:`wp(x := v, Q) = Q[x \\mapsto
    v]`), with each read the effect may alias split on the alias condition,

    .. math:: Q[\\text{state}.C[e].F] \\;\\to\\; (e = \\ell \\wedge Q[v]) \\vee (e \\ne \\ell \\wedge Q)

    where :math:`\\ell` is ``call.args.<arg>``; a quantifier's variable over a collection of records reads its
    record's key as ``o.key``. A list that gains :math:`v` turns ``x in L`` into ``x == v or x in L`` and
    ``L != []`` into true (loses: ``x != v and x in L``, assuming no duplicates).

    Args:
        cond: a condition of the incident rule (no ``result``/``snap`` reads).
        effects: the call's learned effects (:func:`call_effects`).
        macros: the rule file's predicate macros (a check calling one cannot be predicted once the state changes).

    Returns:
        the rewritten condition; True or False when it no longer depends on the state; None when it reads a
        change the effects cannot predict (an opaque effect, a whole record, a ``semantic(...)`` check).

    Example:
        >>> from icml26.air.dsl import cond_text, parse
        >>> text = "any(o in state.objects: o.isToggled == true and o.contents == [])"
        >>> c = parse(f"rule r on after_action(*) detect : {text} end")[0].detect[0]
        >>> cond_text(post_condition(c, [Effect("objects", "object", "isToggled", "set", Lit(True))]))
        'any(o in state.objects: ((o.key == call.args.object or o.isToggled == true) and o.contents == []))'

    Reference: E. W. Dijkstra, "Guarded commands, nondeterminacy and formal derivation of programs", CACM 18(8),
    1975 (weakest preconditions); C. A. R. Hoare, "An axiomatic basis for computer programming", CACM 12(10), 1969.
    """
    if not isinstance(cond, Cond):
        raise TypeError(f"cond must be a Cond, got {type(cond).__name__}")
    if isinstance(effects, Effect) or not all(isinstance(e, Effect) for e in effects):
        raise TypeError("effects must be a sequence of Effect")
    try:
        return _wp(cond, tuple(effects), {}, frozenset(), macros, [MAX_SPLITS])
    except _Unpredictable:
        return None


def _wp(
    c: Cond,
    effects: tuple[Effect, ...],
    scope: dict[str, str | None],
    done: frozenset,
    macros: Any,
    budget: list[int],
) -> Any:
    """``c`` on the post-action state (see :func:`post_condition`); ``budget``: the alias splits left."""
    if not effects:
        return c
    if c.op in ("and", "or"):
        parts = [_wp(a, effects, scope, done, macros, budget) for a in c.args]
        return _and(*parts) if c.op == "and" else _or(*parts)
    if c.op == "not":
        return _not(_wp(c.args[0], effects, scope, done, macros, budget))
    if c.op in ("any", "all"):
        var, coll, body = c.args
        inner = {k: v for k, v in scope.items() if k != var}
        if (
            isinstance(coll, Path_)
            and coll.root == "state"
            and len(coll.parts) == 1
            and isinstance(coll.parts[0], str)
        ):
            if any(e.collection == coll.parts[0] and e.field is None for e in effects):
                raise _Unpredictable  # records added or removed (or not records): the domain changes
            inner[var] = coll.parts[0]  # the variable reads a record of this collection
        else:
            if any(_aliases(p, effects, inner, done) for p in _paths(coll)):
                raise _Unpredictable  # the collection itself changes
            inner[var] = None
        b = _wp(body, effects, inner, done, macros, budget)
        if isinstance(b, bool):
            raise _Unpredictable  # any/all of a constant: not a check the language can write
        return Cond(c.op, (var, coll, b))
    if c.op == "semantic" or (c.op == "pred" and c.args[0] in macros):
        raise _Unpredictable  # reads the state in ways the rewrite cannot see
    for p in _paths(c):
        for e, alias in _aliases(p, effects, scope, done):
            if e.kind == "opaque":
                raise _Unpredictable
            seen = done | {(p, e)}
            hit = _hit(c, p, e)
            hit = _wp(hit, effects, scope, seen, macros, budget) if isinstance(hit, Cond) else hit
            if alias is True:
                return hit
            budget[0] -= 1
            if budget[0] < 0:
                raise _Unpredictable  # too many aliases to split on
            return _case(alias, hit, _wp(c, effects, scope, seen, macros, budget))
    return _fold(c)


def _paths(node: Any) -> list[Path_]:
    """The paths an atom reads, innermost first (an index before the path it indexes)."""
    out: list[Path_] = []
    if isinstance(node, Path_):
        for p in node.parts:
            if not isinstance(p, str):
                out += _paths(p)
        out.append(node)
    elif isinstance(node, ListExpr):
        for i in node.items:
            out += _paths(i)
    elif isinstance(node, Cond):
        for a in node.args:
            if not isinstance(a, str):
                out += _paths(a)
    return out


def _aliases(p: Path_, effects: tuple[Effect, ...], scope: dict[str, str | None], done: frozenset) -> list:
    """``[(effect, alias)]``: the effects a read may see, each with the condition under which it does (True:
    always); raises :class:`_Unpredictable` for a read of a whole changed record or collection."""
    if p.root == "state":
        if not p.parts or not isinstance(p.parts[0], str):
            if effects:
                raise _Unpredictable
            return []
        coll, rest = p.parts[0], p.parts[1:]
        mine = [e for e in effects if e.collection == coll]
        if not mine:
            return []
        if any(e.field is None for e in mine) or len(rest) < 2:
            raise _Unpredictable  # a whole collection, a whole record or a changed top-level value
        index = Lit(rest[0]) if isinstance(rest[0], str) else rest[0]
        field, deeper = rest[1], rest[2:]
    elif scope.get(p.root) is not None:
        mine = [e for e in effects if e.collection == scope[p.root]]
        if not mine:
            return []
        if not p.parts:
            raise _Unpredictable  # the whole record
        index, field, deeper = Path_(p.root, ("key",)), p.parts[0], p.parts[1:]
    else:
        return []  # call, ctx, a quantifier's plain value: not changed by the call
    if not isinstance(field, str):
        raise _Unpredictable
    out = []
    for e in mine:
        if e.field != field or (p, e) in done:
            continue
        if deeper or e.arg is None:
            raise _Unpredictable  # inside a changed value, or a change no argument names
        arg = Path_("call", ("args", e.arg))
        out.append((e, True if index == arg else Cond("compare", (index, arg), "==")))
    return out


def _hit(c: Cond, p: Path_, e: Effect) -> Any:
    """The atom ``c`` on the post-action state where the read ``p`` sees the effect ``e``."""
    if e.kind == "set":
        return _fold(_replace(c, p, e.value))
    empty = ListExpr(())
    if c.op == "in" and c.args[1] == p and p not in _paths(c.args[0]):
        other = Cond("compare", (c.args[0], e.value), "==" if e.kind == "append" else "!=")
        return _or(_fold(other), c) if e.kind == "append" else _and(_fold(other), c)
    if (
        c.op == "compare"
        and c.cmp in ("==", "!=")
        and e.kind == "append"
        and {c.args[0], c.args[1]} == {p, empty}
    ):
        return c.cmp == "!="  # a list that gained an element is not empty
    raise _Unpredictable


def _replace(node: Any, old: Path_, new: Any) -> Any:
    if node == old:
        return new
    if isinstance(node, Path_):
        return Path_(node.root, tuple(p if isinstance(p, str) else _replace(p, old, new) for p in node.parts))
    if isinstance(node, ListExpr):
        return ListExpr(tuple(_replace(i, old, new) for i in node.items))
    if isinstance(node, Cond):
        return Cond(
            node.op, tuple(a if isinstance(a, str) else _replace(a, old, new) for a in node.args), node.cmp
        )
    return node


def _fold(c: Cond) -> Cond | bool:
    """A comparison or ``in`` of literals, decided now (and ``x != x``: false, present or missing)."""
    if c.op == "compare" and c.cmp == "!=" and c.args[0] == c.args[1]:
        return False
    if c.op == "compare" and all(isinstance(a, Lit) for a in c.args):
        try:
            return bool(_CMP[c.cmp](c.args[0].value, c.args[1].value))
        except TypeError:
            return False  # as the evaluator decides an ill-typed comparison
    if (
        c.op == "in"
        and isinstance(c.args[0], Lit)
        and isinstance(c.args[1], ListExpr)
        and all(isinstance(i, Lit) for i in c.args[1].items)
    ):
        return c.args[0].value in [i.value for i in c.args[1].items]
    return c


def _and(*xs: Any) -> Any:
    if any(x is False for x in xs):
        return False
    xs = tuple(x for x in xs if x is not True)
    return True if not xs else xs[0] if len(xs) == 1 else Cond("and", xs)


def _or(*xs: Any) -> Any:
    if any(x is True for x in xs):
        return True
    xs = tuple(x for x in xs if x is not False)
    return False if not xs else xs[0] if len(xs) == 1 else Cond("or", xs)


def _not(x: Any) -> Any:
    return (not x) if isinstance(x, bool) else Cond("not", (x,))


def _case(alias: Cond, hit: Any, miss: Any) -> Any:
    """``(alias and hit) or (not alias and miss)``, shortened when a branch is a constant."""
    if hit is True:
        return _or(alias, miss)
    if hit is False:
        return _and(_not(alias), miss)
    if miss is True:
        return _or(_not(alias), hit)
    if miss is False:
        return _and(alias, hit)
    return _or(_and(alias, hit), _and(_not(alias), miss))


# ----------------------------------------------------------------------------------------------- the template
def post_state_rule(inc: Incident, rule: Rule, evaluator: Evaluator, *, max_checks: int = 10) -> Rule | None:
    """``<rule>__prevent_state``: the incident rule's checks on the state the call is predicted to leave, run
    before the call (see the module docstring), or None when the template does not apply.

    The rule is ``before_action(<the incident call's tool>)`` with :func:`post_condition` of every check of
    ``rule`` that held after the call (its ``when`` and ``detect``, none reading ``result`` or ``snap``), and
    ``not (P1 and ...)`` over the checks :math:`P_i` that held after the call but not before: it fires on a call
    that *breaks* the invariant, :math:`\\neg I(s) \\wedge I(\\hat s')`, with :math:`\\hat s'` the predicted state.

    Args:
        inc: an ``after_action`` or ``state_change`` incident with its pre-action step (``pre_bindings``) and
            its post-action state (``bindings["state"]``).
        rule: the incident rule.
        evaluator: the responder's evaluator (its macros; undecidable checks are logged in its ``errors``).
        max_checks: the validator's check budget (``RuleValidator.max_predicates``); a longer rule is not offered.

    Returns:
        the rule, parsed back from its text; None when no check held only after the call (the pre-state
        template covers it), when a check cannot be predicted or can never hold, over the budget, or when the
        rewritten checks do not fire on the incident's own pre-action step.

    Example:
        >>> from icml26.air.dsl import parse
        >>> rule = parse('rule on_empty on after_action(robot.turn_on) detect : any(o in state.objects: '
        ...              'o.isToggled == true and o.contents == []) end')[0]
        >>> pre = {"objects": {"Stove": {"isToggled": False, "contents": []}}}
        >>> post = {"objects": {"Stove": {"isToggled": True, "contents": []}}}
        >>> call = {"name": "robot.turn_on", "args": {"object": "Stove"}}
        >>> inc = Incident(1, "on_empty", "high", "after_action", 1, call, {}, 0.0, bindings={"state": post})
        >>> inc.pre_bindings = {"call": call, "state": pre, "ctx": {}, "result": None, "snap": {"pre_step": pre}}
        >>> r = post_state_rule(inc, rule, Evaluator())
        >>> r.name, r.triggers[0].tools, len(r.detect)
        ('on_empty__prevent_state', ('robot.turn_on',), 2)

    Reference: AIR (arXiv:2602.11749), eradication: a synthesised guardrail rule blocks similar incidents in
    future executions; the rewrite is a weakest precondition (:func:`post_condition`).
    """
    if not isinstance(inc, Incident):
        raise TypeError(f"inc must be an Incident, got {type(inc).__name__}")
    if not isinstance(rule, Rule):
        raise TypeError(f"rule must be a Rule, got {type(rule).__name__}")
    if not isinstance(evaluator, Evaluator):
        raise TypeError(f"evaluator must be an Evaluator, got {type(evaluator).__name__}")
    if not isinstance(max_checks, int) or isinstance(max_checks, bool) or max_checks < 1:
        raise ValueError(f"max_checks must be a positive int, got {max_checks!r}")
    if inc.phase not in ("after_action", "state_change"):
        return None  # a finish incident: no one call's before and after
    env = pre_action_env(inc)
    if (
        env is None
        or not isinstance(env.get("call"), Mapping)
        or not isinstance(env.get("call", {}).get("name"), str)
    ):
        return None
    pre, post = env.get("state"), inc.bindings.get("state")
    if not isinstance(pre, Mapping) or not isinstance(post, Mapping):
        return None
    after_env = {**env, "state": post}  # the same call and context, the state after the call
    checks = [
        c
        for c in (*([rule.when] if rule.when else []), *rule.detect)
        if pre_action_safe(c) and holds_before(evaluator, c, after_env)
    ]
    broken = [c for c in checks if not holds_before(evaluator, c, env)]
    if not broken:
        return None
    effects = call_effects(env["call"], pre, post)
    conds = []
    for c in checks:
        w = post_condition(c, effects, macros=evaluator.macros)
        if w is None or w is False:
            return None
        if w is not True:
            conds.append(w)
    conds.append(_not(_and(*broken)))  # the invariant did not already hold: this call breaks it
    if count_checks(conds) > max_checks:
        return None
    out = Rule(
        name=f"{rule.name}__prevent_state",
        triggers=(Trigger("before_action", (env["call"]["name"],)),),
        detect=tuple(conds),
        severity=rule.severity,
        contain=(Action("block"),),
        provenance="template",
    )
    try:
        out = parse(out.to_text(), file="<post-state template>")[0]
    except RuleSyntaxError:
        return None
    if not all(holds_before(evaluator, c, env) for c in out.detect):
        return None  # the learned effect does not reproduce the incident
    return out
