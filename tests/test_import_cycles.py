"""No import circles among icml26 modules (issue #47), module-level and function-level imports alike.

Every module under ``src/icml26`` is parsed with ``ast``; each ``import x`` / ``from x import y`` anywhere in the
file (lazy imports inside functions count: they still tie the two modules together) adds an edge to the icml26
modules it names, relative imports resolved against the importing module's package. ``from pkg import name``
adds ``pkg.name`` when that is a module, else ``pkg``. A cycle is a strongly connected component of more than
one module, or a module importing itself. No cycle is allowed, AIR's included (issue #48).

AIR (``icml26.air``) is also layered (issue #48): each module belongs to one layer, in the order of
:data:`AIR_LAYERS`, and imports (at module level or lazily) only from its own layer and the layers before it;
the package itself and the re-export modules of the paths documented before the split (:data:`AIR_TOP`) sit above
every layer, and no layer imports them.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
AIR = "icml26.air"
#: AIR's layers, first to last: ``icml26.air.<layer>`` (a package or a module) may import only from its own layer
#: and the layers before it
AIR_LAYERS = ("core", "dsl", "policy", "runtime", "eradicate", "integrations", "worlds", "experiment")
#: above every layer: the package's public face and the re-exports of paths documented before the split
AIR_TOP = frozenset({AIR, f"{AIR}.envs", f"{AIR}.llm", f"{AIR}.manifest", f"{AIR}.synth"})
#: outside the layers: imports no AIR module, and no AIR module imports it (a test oracle)
AIR_ISOLATED = frozenset({f"{AIR}.reference"})


def _module_name(path: Path, root: Path) -> tuple[str, bool]:
    """``(dotted name, is package)`` of a ``.py`` file under ``root``."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    is_pkg = parts[-1] == "__init__"
    if is_pkg:
        parts = parts[:-1]
    return ".".join(parts), is_pkg


def _resolve(module: str | None, level: int, current: str, is_pkg: bool) -> str:
    """The absolute name a (possibly relative) ``from`` import refers to."""
    if level == 0:
        return module or ""
    package = current if is_pkg else current.rpartition(".")[0]
    for _ in range(level - 1):
        package = package.rpartition(".")[0]
    return f"{package}.{module}" if module else package


def _owner(name: str, modules: set[str]) -> str | None:
    """The longest known module that ``name`` is or lies inside (``a.b.attr`` -> ``a.b``)."""
    while name:
        if name in modules:
            return name
        name = name.rpartition(".")[0]
    return None


def import_graph(root: Path = SRC, package: str = "icml26") -> dict[str, set[str]]:
    """Module -> the icml26 modules it imports, anywhere in its source."""
    files = {}
    for path in sorted((root / package).rglob("*.py")):
        name, is_pkg = _module_name(path, root)
        files[name] = (path, is_pkg)
    modules = set(files)
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for name, (path, is_pkg) in files.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = _resolve(node.module, node.level, name, is_pkg)
                for alias in node.names:
                    sub = f"{base}.{alias.name}"
                    targets.append(sub if sub in modules else base)
            for target in targets:
                owner = _owner(target, modules)
                if owner is not None:
                    graph[name].add(owner)
    return graph


def find_cycles(graph: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """Strongly connected components of size > 1 and self loops, each sorted (Tarjan, iterative)."""
    adj = {v: sorted(set(ws)) for v, ws in graph.items()}
    for ws in list(adj.values()):
        for w in ws:
            adj.setdefault(w, [])
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    cycles: list[list[str]] = []
    counter = 0
    for start in sorted(adj):
        if start in index:
            continue
        work = [(start, 0)]
        while work:
            v, i = work.pop()
            if i == 0:
                index[v] = low[v] = counter
                counter += 1
                stack.append(v)
                on_stack.add(v)
            recursed = False
            for j in range(i, len(adj[v])):
                w = adj[v][j]
                if w not in index:
                    work.append((v, j + 1))
                    work.append((w, 0))
                    recursed = True
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            if recursed:
                continue
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1 or v in adj[v]:
                    cycles.append(sorted(comp))
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[v])
    return sorted(cycles)


def _in_air(module: str) -> bool:
    return module == AIR or module.startswith(AIR + ".")


def air_rank(module: str) -> int | None:
    """The place of an AIR module in the layer order (``len(AIR_LAYERS)`` for :data:`AIR_TOP`; None for
    :data:`AIR_ISOLATED` and for a module in no layer)."""
    if module in AIR_TOP:
        return len(AIR_LAYERS)
    head = module[len(AIR) + 1:].partition(".")[0] if module.startswith(AIR + ".") else ""
    return AIR_LAYERS.index(head) if head in AIR_LAYERS else None


def layer_violations(graph: Mapping[str, Iterable[str]]) -> list[str]:
    """``importer -> imported: why`` for every AIR import against the layer order, and every AIR module that
    belongs to no layer."""
    out = []
    for module in sorted(m for m in graph if _in_air(m)):
        rank = air_rank(module)
        if rank is None and module not in AIR_ISOLATED:
            out.append(f"{module}: in no layer (add it to AIR_LAYERS' packages, AIR_TOP or AIR_ISOLATED)")
            continue
        for target in sorted(t for t in graph[module] if _in_air(t) and t != module):
            t_rank = air_rank(target)
            if module in AIR_ISOLATED or target in AIR_ISOLATED:
                out.append(f"{module} -> {target}: {sorted(AIR_ISOLATED)} stay outside the layers")
            elif t_rank is not None and t_rank > rank:
                what = "the top (re-exports)" if t_rank == len(AIR_LAYERS) else f"layer {AIR_LAYERS[t_rank]}"
                out.append(f"{module} -> {target}: layer {AIR_LAYERS[rank]} imports {what}, which comes after it")
    return out


def test_cycle_finder_on_a_synthetic_graph():
    graph = {
        "a": {"b"}, "b": {"c"}, "c": {"a", "d"},  # a -> b -> c -> a
        "d": {"e"}, "e": set(),                    # a chain, no cycle
        "f": {"f"},                                # a self loop
        "g": {"h"}, "h": {"g", "d"},               # a two-cycle
    }
    assert find_cycles(graph) == [["a", "b", "c"], ["f"], ["g", "h"]]
    assert find_cycles({"x": {"y"}, "y": {"z"}}) == []


def test_import_graph_resolves_relative_and_lazy_imports(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("from .a import f\n")
    (pkg / "a.py").write_text("def f():\n    from .sub import b\n    return b\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "b.py").write_text("from ..a import f\nimport pkg.sub\n")
    graph = import_graph(tmp_path, "pkg")
    assert graph == {"pkg": {"pkg.a"}, "pkg.a": {"pkg.sub.b"}, "pkg.sub": set(), "pkg.sub.b": {"pkg.a", "pkg.sub"}}
    assert find_cycles(graph) == [["pkg.a", "pkg.sub.b"]]


def test_no_import_cycles():
    cycles = find_cycles(import_graph())
    assert not cycles, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in cycles)


def test_air_layer_checker_on_a_synthetic_graph():
    graph = {
        f"{AIR}": {f"{AIR}.runtime.responder"},
        f"{AIR}.core.records": set(),
        f"{AIR}.dsl.parser": {f"{AIR}.core.records", f"{AIR}.dsl.nodes"},      # before it and its own layer
        f"{AIR}.dsl.nodes": {f"{AIR}.runtime.responder"},                      # a later layer (lazily or not)
        f"{AIR}.runtime.responder": {f"{AIR}.synth", "icml26.common.optional"},  # a re-export, above every layer
        f"{AIR}.synth": {f"{AIR}.eradicate"},
        f"{AIR}.eradicate": set(),
        f"{AIR}.helpers": set(),                                               # in no layer
        f"{AIR}.reference": {f"{AIR}.core.records"},                           # the oracle imports AIR
    }
    assert layer_violations(graph) == [
        f"{AIR}.dsl.nodes -> {AIR}.runtime.responder: layer dsl imports layer runtime, which comes after it",
        f"{AIR}.helpers: in no layer (add it to AIR_LAYERS' packages, AIR_TOP or AIR_ISOLATED)",
        f"{AIR}.reference -> {AIR}.core.records: ['{AIR}.reference'] stay outside the layers",
        f"{AIR}.runtime.responder -> {AIR}.synth: layer runtime imports the top (re-exports), which comes after it",
    ]


def test_air_imports_follow_its_layers():
    """Every ``icml26.air`` module imports (at module level or inside a function) only from its own layer and the
    layers before it: core, dsl, policy, runtime, eradicate, integrations, worlds, experiment."""
    graph = import_graph()
    problems = layer_violations(graph)
    assert not problems, "AIR layer order broken:\n" + "\n".join(problems)
    assert {air_rank(m) for m in graph if _in_air(m)} >= set(range(len(AIR_LAYERS) + 1))   # every layer is there
