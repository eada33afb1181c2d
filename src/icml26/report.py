"""``icml26 report``: regenerate the README tables from ``results/`` and the paper cards.

Generated blocks sit between markers and are rewritten idempotently:

- top-level ``README.md``: ``<!-- icml26:index:begin/end -->`` (the nineteen papers and their status) and
  ``<!-- icml26:results:begin/end -->`` (one row per implemented paper: its headline claim from
  ``results/<slug>/quick.json``);
- each implemented paper's ``src/icml26/<slug>/README.md``: ``<!-- icml26:results:begin/end -->`` (every
  claim and every arm, for each mode that has a result).

``check=True`` changes nothing and lists what is stale: a table that differs from what the results give, an
implemented paper without ``quick.json``, a result whose claims no longer match its card.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .common.claims import describe_stat, summarize_refs
from .common.io import atomic_write_text
from .common.results import ResultSchemaError, read_result
from .registry import Paper, list_papers

REPORT_MODES = ("quick", "full")


class ReportError(RuntimeError):
    """The tree cannot be reported on (no root found, markers missing)."""


@dataclass
class ReportOutcome:
    """What ``update`` found: files rewritten (or stale, in check mode) and other problems."""

    changed: list[Path] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.changed and not self.problems


def find_root(start: str | Path | None = None) -> Path:
    """The project root: the nearest directory at or above ``start`` (default cwd) whose pyproject names icml26."""
    here = Path(start or Path.cwd()).resolve()
    for d in (here, *here.parents):
        pp = d / "pyproject.toml"
        if pp.is_file() and re.search(r'(?m)^name\s*=\s*"icml26"\s*$', pp.read_text(encoding="utf-8")):
            return d
    raise ReportError(f"no icml26 project root (pyproject.toml with name = \"icml26\") at or above {here}")


def _marker(name: str) -> tuple[str, str]:
    return f"<!-- icml26:{name}:begin -->", f"<!-- icml26:{name}:end -->"


def replace_block(text: str, name: str, content: str, *, where: str = "file") -> str:
    """Replace what lies between the ``name`` markers in ``text`` with ``content``."""
    begin, end = _marker(name)
    i, j = text.find(begin), text.find(end)
    if i < 0 or j < 0 or j < i:
        raise ReportError(f"{where}: markers {begin} ... {end} are missing or out of order")
    return text[: i + len(begin)] + "\n" + content.rstrip("\n") + "\n" + text[j:]


def _cell(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def markdown_table(headers: Iterable[str], rows: Iterable[Iterable[Any]]) -> str:
    """A GitHub Markdown table."""
    headers = list(headers)
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _result_path(results_dir: Path, slug: str, mode: str) -> Path:
    return results_dir / slug / f"{mode}.json"


def _holds(flag: bool) -> str:
    return "yes" if flag else "**no**"


def _load(results_dir: Path, paper: Paper, mode: str, problems: list[str]) -> dict[str, Any] | None:
    path = _result_path(results_dir, paper.slug, mode)
    if not path.is_file():
        return None
    try:
        data = read_result(path)
    except ResultSchemaError as exc:
        problems.append(str(exc))
        return None
    card_claims = {c.id: c for c in paper.claims_for(mode)}
    got = {c["id"]: c for c in data["claims"]}
    for cid, claim in card_claims.items():
        if cid not in got:
            problems.append(f"{path}: card claim {cid!r} is missing; rerun `icml26 reproduce {paper.slug} --mode {mode}`")
        elif got[cid]["check"] != claim.check.text:
            problems.append(f"{path}: claim {cid!r} was decided by an older check; rerun `icml26 reproduce {paper.slug} --mode {mode}`")
    for cid in set(got) - set(card_claims):
        problems.append(f"{path}: claim {cid!r} is no longer on the card; rerun `icml26 reproduce {paper.slug} --mode {mode}`")
    return data


def render_index(papers: list[Paper]) -> str:
    """The README index of all papers with their status."""
    rows = []
    for p in papers:
        readme = p.folder / "README.md"
        link = f"[`{p.slug}`](src/icml26/{p.slug}/{'README.md' if readme.is_file() else 'paper.toml'})"
        rows.append([f"{p.number:02d}", link, p.short, p.kind, p.status])
    return markdown_table(["#", "slug", "paper", "kind", "status"], rows)


def render_summary(papers: list[Paper], results_dir: Path, problems: list[str]) -> str:
    """The README results table: one row per implemented paper, its headline claim in quick mode."""
    rows = []
    for p in papers:
        if not p.implemented:
            continue
        data = _load(results_dir, p, "quick", problems)
        if data is None:
            problems.append(f"{p.slug} is implemented but has no valid {_result_path(results_dir, p.slug, 'quick')}; "
                            f"run `icml26 reproduce {p.slug} --mode quick`")
            continue
        claim = p.headline
        entry = next((c for c in data["claims"] if c["id"] == claim.id), None)
        if entry is None:
            continue
        method, baseline = summarize_refs(claim.check, data["arms"])
        rows.append([f"[`{p.slug}`](src/icml26/{p.slug}/README.md)", claim.text, baseline or "—", method,
                     str(claim.paper), _holds(entry["holds"]), f"{data['wall_s']:.0f} s"])
    if not rows:
        return "_No paper is implemented yet._"
    header = ["paper", "claim", "baseline (ours)", "method (ours)", "paper's value (where; scale)", "holds?",
              "quick time"]
    return markdown_table(header, rows) + (
        "\n\nQuick mode, mean ± std over the card's seeds, on this project's 2-core CPU machine. "
        "`holds?` is computed from each card's check; every claim is in the paper's README."
    )


def render_paper(paper: Paper, results_dir: Path, problems: list[str]) -> str:
    """A paper README's generated block: claims and arms for each mode with a result."""
    parts: list[str] = []
    for mode in REPORT_MODES:
        data = _load(results_dir, paper, mode, problems)
        if data is None:
            continue
        env = data["env"]
        parts.append(
            f"### {mode} mode — seeds {', '.join(map(str, data['seeds']))}; {data['wall_s']:.0f} s; "
            f"torch {env.get('torch')}, git {str(env.get('git_sha'))[:10]}"
        )
        rows = [[c["id"], c["text"], f"{c['paper']['value']} ({c['paper']['where']}; {c['paper']['scale']})",
                 c["ours"], _holds(c["holds"]), c["why"]] for c in data["claims"]]
        parts.append(markdown_table(["claim", "statement", "paper", "ours", "holds?", "why"], rows))
        parts.append(render_arms(data["arms"]))
    if not parts:
        return f"_No results yet: run `icml26 reproduce {paper.slug} --mode quick`._"
    return "\n\n".join(parts)


def render_arms(arms: dict[str, dict[str, Any]]) -> str:
    """Every measured value, mean ± std over seeds: one row per metric, one column per arm that has it.

    Metrics measured by disjoint sets of arms go to separate tables, so no table is mostly empty.
    """
    groups: dict[tuple[str, ...], list[str]] = {}
    for metric in sorted({m for v in arms.values() for m in v}):
        owners = tuple(a for a, v in arms.items() if metric in v)
        groups.setdefault(owners, []).append(metric)
    tables = []
    for owners, metrics in groups.items():
        rows = [[m] + [describe_stat(arms[a][m]) for a in owners] for m in metrics]
        tables.append(markdown_table(["metric", *owners], rows))
    return "\n\n".join(tables)


def _update_file(path: Path, blocks: dict[str, str], check: bool, outcome: ReportOutcome) -> None:
    if not path.is_file():
        outcome.problems.append(f"{path} is missing")
        return
    old = path.read_text(encoding="utf-8")
    new = old
    for name, content in blocks.items():
        try:
            new = replace_block(new, name, content, where=str(path))
        except ReportError as exc:
            outcome.problems.append(str(exc))
            return
    if new != old:
        outcome.changed.append(path)
        if not check:
            atomic_write_text(path, new)


def update(root: str | Path | None = None, *, check: bool = False, results_dir: str | Path | None = None,
           papers: list[Paper] | None = None) -> ReportOutcome:
    """Regenerate every table under ``root`` (or, with ``check``, only list what is stale).

    Args:
        root: project root (default: ``find_root()``).
        check: change nothing; report stale files in ``outcome.changed``.
        results_dir: default ``root/results``.
        papers: default all registered papers.
    """
    root = find_root() if root is None else Path(root)
    results = Path(results_dir) if results_dir is not None else root / "results"
    papers = list_papers() if papers is None else papers
    outcome = ReportOutcome()
    problems: list[str] = []
    _update_file(root / "README.md", {"index": render_index(papers),
                                      "results": render_summary(papers, results, problems)}, check, outcome)
    for p in papers:
        if p.implemented:
            block = render_paper(p, results, problems)
            _update_file(root / "src" / "icml26" / p.slug / "README.md", {"results": block}, check, outcome)
    outcome.problems.extend(dict.fromkeys(problems))  # de-duplicated, in order
    return outcome
