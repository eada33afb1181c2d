"""AIR's dsl layer, the checks parse and lint share: known predicates and roots, unique rule names."""

from __future__ import annotations

from .nodes import ROOTS, SEVERITIES, Cond, Path_, RuleSet, _quantified, _walk
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
