"""``icml26 report``: regenerate the README tables from ``results/`` and verify every stored verdict.

Generated blocks sit between markers and are rewritten idempotently:

- top-level ``README.md``: ``<!-- icml26:index:begin/end -->`` (the nineteen papers and their status) and
  ``<!-- icml26:results:begin/end -->`` (one row per implemented paper: the headline's verdict with its
  interval, and how many evidence claims hold / are inconclusive / fail in quick and full mode);
- each implemented paper's ``src/icml26/<slug>/README.md``: ``<!-- icml26:results:begin/end -->`` (every
  claim with its interval and verdict, and every arm, for each mode) and, where the paper has a benchmark,
  ``<!-- icml26:bench:begin/end -->`` (from ``results/<slug>/bench.json``), and for each
  ``<!-- icml26:arms_PREFIX:begin/end -->`` the paper writes (e.g. near its top, to lead with one comparison), the
  arms named ``PREFIX`` or ``PREFIX_...`` of its full result (else quick), their summary metrics (a metric named
  ``name/part``, a per-part breakdown, is left to the results block).

``check=True`` changes nothing and lists every problem: a stale table; an implemented paper without
``quick.json`` or ``full.json``; a result whose means, standard deviations, verdicts, intervals or ``ours``
text do not follow from its stored values; claims, kinds or seeds that differ from the card; a result from a
dirty tree, from source files that changed since (named, with the command that regenerates it) or marked
incomplete; a number typed into a paper README's prose that repeats a measured value.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .common.claims import RULES, VERDICTS, Check, components, describe_interval, describe_stat, parse_check
from .common.io import atomic_write_text
from .common.repro import provenance
from .common.results import ResultSchemaError, markdown_table, read_result, summarize
from .history import (
    Git,
    card_at,
    card_history,
    decision_of,
    first_result,
    provenance_problems,
    render_card_history,
)
from .registry import Paper, list_papers

REPORT_MODES = ("quick", "full")
#: relative tolerance when a stored number is compared with its recomputation
RECOMPUTE_RTOL = 1e-9
_VERDICT_CELL = {"holds": "holds", "inconclusive": "*inconclusive*", "fails": "**fails**"}


class ReportError(RuntimeError):
    """The tree cannot be reported on (no root found, markers missing)."""


@dataclass
class ReportOutcome:
    """What ``update`` found: files rewritten (or stale, in check mode) and other problems."""

    changed: list[Path] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    notices: list[str] = field(default_factory=list)

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


def has_block(text: str, name: str) -> bool:
    begin, end = _marker(name)
    return begin in text and end in text


def replace_block(text: str, name: str, content: str, *, where: str = "file") -> str:
    """Replace what lies between the ``name`` markers in ``text`` with ``content``."""
    begin, end = _marker(name)
    i, j = text.find(begin), text.find(end)
    if i < 0 or j < 0 or j < i:
        raise ReportError(f"{where}: markers {begin} ... {end} are missing or out of order")
    return text[: i + len(begin)] + "\n" + content.rstrip("\n") + "\n" + text[j:]


def _result_path(results_dir: Path, slug: str, mode: str) -> Path:
    return results_dir / slug / f"{mode}.json"


def _regen(paper: Paper, mode: str) -> str:
    return f"`icml26 reproduce {paper.slug} --mode {mode}` from a clean commit"


# -- verification ----------------------------------------------------------------------------------------
def _close(a: Any, b: Any) -> bool:
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        fa, fb = float(a), float(b)
        if math.isnan(fa) or math.isnan(fb):
            return math.isnan(fa) and math.isnan(fb)
        if math.isinf(fa) or math.isinf(fb):
            return fa == fb
        return abs(fa - fb) <= RECOMPUTE_RTOL * max(1.0, abs(fa), abs(fb))
    return a == b


def verify_result(paper: Paper, mode: str, data: Mapping[str, Any], path: Path | str,
                  git: Git | None = None) -> list[str]:
    """Everything wrong with a stored result: recomputed numbers, card agreement, provenance.

    Every mean, std, per-unit mean, verdict, estimate, interval, test, units and ``ours`` text is recomputed
    from the stored values with the rules the result was decided by (``rules``: 5, or 3 and 4 for results
    written before verdicts v5); claims (text, check, kind, direction, headline flag, minimum-effect reason, paper
    value) and seeds are compared with the card; the tree the result came from must have been clean and its
    source files must hash as they do now. With ``git``: ``env.git_sha`` must be a commit of this branch, the
    card and source hashes must be those of that commit, and the card's decision fields then must equal the
    card's now.
    """
    from .runner import claim_entry, gated_entries, headline_entry  # the runner imports this lazily: no cycle

    out: list[str] = []
    regen = _regen(paper, mode)
    if not data.get("complete", False):
        out.append(f"{path}: a partial result (complete = false); finish it with {regen}")
    if list(data["seeds"]) != list(paper.modes[mode].seeds):
        out.append(f"{path}: seeds {data['seeds']} differ from the card's {list(paper.modes[mode].seeds)}; "
                   f"rerun {regen}")
    for arm, metrics in data["arms"].items():
        for name, stat in metrics.items():
            fresh = summarize(stat["values"])
            if not (_close(fresh["mean"], stat["mean"]) and _close(fresh["std"], stat["std"])):
                out.append(f"{path}: {arm}.{name}: stored mean/std ({stat['mean']}, {stat['std']}) do not "
                           f"follow from its values ({fresh['mean']}, {fresh['std']})")
            if "unit_values" in stat:
                means = [math.fsum(u) / len(u) for u in stat["unit_values"]]
                if not _close(means, stat["values"]):
                    out.append(f"{path}: {arm}.{name}: per-seed values are not the means of its {stat['unit']}")
    card = {c.id: c for c in paper.claims_for(mode)}
    got = {c["id"]: c for c in data["claims"]}
    for cid in got.keys() - card.keys():
        out.append(f"{path}: claim {cid!r} is no longer on the card; rerun {regen}")
    for cid, claim in card.items():
        stored = got.get(cid)
        if stored is None:
            out.append(f"{path}: card claim {cid!r} is missing; rerun {regen}")
            continue
        if stored["check"] != claim.check.text:
            out.append(f"{path}: claim {cid!r} was decided by an older check ({stored['check']!r}, the card "
                       f"now says {claim.check.text!r}); rerun {regen}")
            continue
        try:
            fresh = claim_entry(claim, data["arms"], stored.get("notes", []), data.get("unit_ids"),
                                rules=data["rules"])
        except (KeyError, ValueError) as exc:
            out.append(f"{path}: claim {cid!r} cannot be recomputed from the stored arms: {exc.args[0]}")
            continue
        differ = [k for k, v in fresh.items() if not _close(v, stored.get(k))]
        if differ:
            detail = "; ".join(f"{k}: stored {stored.get(k)!r}, recomputed {fresh[k]!r}" for k in differ[:3])
            out.append(f"{path}: claim {cid!r} does not follow from the stored values or the card ({detail})")
    head = headline_entry(paper, data["claims"]) if paper.headline.id in card else None
    if head is not None and not _close(head, data.get("headline")):
        out.append(f"{path}: its headline entry does not follow from its claims ({data.get('headline')!r})")
    gated = gated_entries(paper, data["claims"])
    if gated != data.get("gated", {}):
        out.append(f"{path}: its gated claims ({data.get('gated', {})!r}) do not follow from its claims and the "
                   f"card's scoped preconditions ({gated!r}); rerun {regen}")
    leaks = {u: c for u, c in data.get("overlap", {}).items() if any(any(v) for v in c.values())}
    if leaks:
        out.append(f"{path}: test units overlap training or validation units {leaks}; rerun {regen}")
    if git is not None:
        out.extend(provenance_problems(git, paper.slug, data, str(path)))
        sha = str(data.get("env", {}).get("git_sha") or "")
        then = card_at(git, sha, paper.slug) if git.is_commit_on_branch(sha) else None
        if then is not None:
            for cid in card:
                old = decision_of(then, cid)
                now = decision_of(_card_dict(paper), cid)
                if old is not None and now is not None and old != now:
                    fields = [f"{f} {old[f]!r} -> {now[f]!r}" for f in old if old[f] != now[f]]
                    out.append(f"{path}: claim {cid!r} changed on the card since the result was written "
                               f"({'; '.join(fields)}); rerun {regen}")
    env = data.get("env", {})
    if env.get("git_dirty"):
        files = env.get("git_dirty_files") or ["(files not recorded)"]
        out.append(f"{path}: written from a dirty tree (uncommitted: {', '.join(files[:6])}); rerun {regen}")
    if env.get("git_sha") is None:
        out.append(f"{path}: written outside a git checkout (no commit recorded); rerun {regen}")
    stored_src = data["provenance"]["sources"]
    now_src = provenance(paper.slug, paper.path, paper.folder.parent)["sources"]
    changed = sorted(f for f in stored_src.keys() & now_src.keys() if stored_src[f] != now_src[f])
    added = sorted(now_src.keys() - stored_src.keys())
    removed = sorted(stored_src.keys() - now_src.keys())
    if changed or added or removed:
        parts = [f"{label}: {', '.join(files)}" for label, files in
                 (("changed", changed), ("new", added), ("removed", removed)) if files]
        out.append(f"{path}: the source files that made it differ now ({'; '.join(parts)}); rerun {regen}")
    return out


def _card_dict(paper: Paper) -> dict[str, Any]:
    import tomllib

    return tomllib.loads(paper.path.read_text(encoding="utf-8"))


def config_problems(paper: Paper, mode: str, data: Mapping[str, Any], path: Path | str) -> list[str]:
    """The stored ``config`` must be the experiment's preset for ``mode`` (imports the experiment module)."""
    from .registry import missing_extras
    from .runner import _jsonable_config, load_experiment

    if missing_extras(paper):
        return []  # the experiment cannot be imported here; `icml26 reproduce` names the extras
    try:
        exp = load_experiment(paper)
    except Exception as exc:
        return [f"{path}: cannot import {paper.slug}'s experiment to compare its config ({type(exc).__name__}: "
                f"{exc})"]
    preset = json.loads(json.dumps(_jsonable_config(exp.PRESETS[mode]), default=str))
    stored = data.get("config", {})
    differ = sorted(k for k in preset.keys() | stored.keys() if not _close(preset.get(k), stored.get(k)))
    if differ:
        detail = "; ".join(f"{k}: stored {stored.get(k)!r}, preset {preset.get(k)!r}" for k in differ[:4])
        return [f"{path}: config differs from the {mode} preset ({detail}); rerun {_regen(paper, mode)}"]
    return []


def _load(results_dir: Path, paper: Paper, mode: str, problems: list[str], git: Git | None = None,
          configs: bool = False) -> dict[str, Any] | None:
    path = _result_path(results_dir, paper.slug, mode)
    if not path.is_file():
        if paper.implemented:
            problems.append(f"{paper.slug} is implemented but has no {path}; run {_regen(paper, mode)}")
        return None
    try:
        data = read_result(path)
    except ResultSchemaError as exc:
        problems.append(f"{exc}; rerun {_regen(paper, mode)}")
        return None
    problems.extend(verify_result(paper, mode, data, path, git))
    if configs:
        problems.extend(config_problems(paper, mode, data, path))
    return data


# -- the README numbers check ---------------------------------------------------------------------------
_NUMBER_RE = re.compile(r"(?<![\w.\-/])(\d+\.\d{2,})(?![\w.]*\d)")
_FENCE_RE = re.compile(r"```.*?```", re.S)
_BLOCK_RE = re.compile(r"<!-- icml26:(\w+):begin -->.*?<!-- icml26:\1:end -->", re.S)


def _measured_numbers(datas: Iterable[Mapping[str, Any]]) -> set[float]:
    out: set[float] = set()
    for data in datas:
        for metrics in data.get("arms", {}).values():
            for stat in metrics.values():
                out.update(float(v) for v in (stat["mean"], *stat["values"]))
        for c in data.get("claims", []):
            out.update(float(v) for v in (c["estimate"], *c["interval"], *c["per_seed"]))
        for row in data.get("rows", []):
            out.add(float(row["ratio"]))
    return {v for v in out if math.isfinite(v)}


def typed_numbers(text: str, measured: set[float], allowed: Iterable[str] = ()) -> list[str]:
    """Decimal numbers in Markdown prose (outside generated blocks and code) that repeat a measured value.

    A number with ``d`` decimals is flagged when some measured value rounds to it at ``d`` decimals, unless it
    appears in ``allowed`` (the paper's own values, checks, the run's configuration and environment, e.g. a
    torch version). Such a number goes stale the day the results change: refer to the generated tables instead.
    """
    prose = _FENCE_RE.sub("", _BLOCK_RE.sub("", text))
    allowed_text = " ".join(allowed)
    flagged = []
    for m in _NUMBER_RE.finditer(prose):
        token = m.group(1)
        if token in allowed_text:
            continue
        digits = len(token.split(".")[1])
        value = float(token)
        if any(round(v, digits) == value or round(-v, digits) == value for v in measured):
            flagged.append(token)
    return list(dict.fromkeys(flagged))


# -- rendering -------------------------------------------------------------------------------------------
def render_index(papers: list[Paper]) -> str:
    """The README index of all papers with their status."""
    rows = []
    for p in papers:
        readme = p.folder / "README.md"
        link = f"[`{p.slug}`](src/icml26/{p.slug}/{'README.md' if readme.is_file() else 'paper.toml'})"
        rows.append([f"{p.number:02d}", link, p.short, p.kind, p.status])
    return markdown_table(["#", "slug", "paper", "kind", "status"], rows)


def tally(data: Mapping[str, Any] | None) -> str:
    """``"3 / 1 / 2"``: evidence claims that hold / are inconclusive / fail (sanity checks are not counted, nor is
    a claim a scoped precondition leaves not decidable)."""
    if data is None:
        return "—"
    counts = dict.fromkeys(VERDICTS, 0)
    gated = data.get("gated", {})
    for c in data["claims"]:
        if c["kind"] == "evidence" and gated.get(c["id"], {}).get("decidable", True):
            counts[c["verdict"]] += 1
    return " / ".join(str(counts[v]) for v in VERDICTS)


def current_rules_agree(data: Mapping[str, Any]) -> bool:
    """Whether this module's rules (``RULES``) give every stored claim of a result decided by older rules the
    same verdict and bounds (then the result's numbers stand as they are; otherwise it is to be regenerated)."""
    for claim in data["claims"]:
        try:
            out = parse_check(claim["check"]).evaluate(data["arms"], unit_ids=data.get("unit_ids"), rules=RULES)
        except (KeyError, ValueError):
            return False
        if out.verdict != claim["verdict"] or not _close(list(out.interval), claim["interval"]):
            return False
    return True


def rules_note(data: Mapping[str, Any]) -> str:
    """``""`` for a result decided by this module's rules, else which rules decided it and whether the current
    ones agree."""
    if data["rules"] >= RULES:
        return ""
    if current_rules_agree(data):
        return f"verdicts v{data['rules']}; v{RULES} decides the same"
    return f"verdicts v{data['rules']}, to be regenerated: v{RULES} decides differently"


def _headline_cell(entry: Mapping[str, Any] | None, data: Mapping[str, Any] | None) -> str:
    if entry is None or data is None:
        return "—"
    cell = _VERDICT_CELL[entry["verdict"]]
    head = data.get("headline")
    if head is not None and not head["decidable"]:
        cell = f"{_gate_text(head)}; measured: {cell}"
    if data["rules"] < RULES and not current_rules_agree(data):
        cell += f" (verdicts v{data['rules']}, to be regenerated)"
    return cell


def min_effect(check: Check) -> float | None:
    """The minimum effect a comparative check asks, on its scale (log for a ratio); None for one ref."""
    if check.baseline is None:
        return None
    if check.combine == "/":
        return abs(math.log(check.threshold))
    return abs(check.threshold)


def power_statement(paper: Paper, quick: Mapping[str, Any] | None, full: Mapping[str, Any] | None
                    ) -> dict[str, Any] | None:
    """The headline's power, from the quick result's variance: quick's power at the minimum effect, and the
    smallest effect the full preset detects with power 0.8 (its seeds, the full result's units per seed). Where
    quick has one distinct run, the seed-to-seed spread comes from the full result (when it has runs)."""
    claim = paper.headline
    if quick is None or claim.id not in {c["id"] for c in quick["claims"]}:
        return None
    try:
        comp = components(claim.check, quick["arms"], quick.get("unit_ids"))
    except (KeyError, ValueError):
        return None
    if comp is None:
        return None
    spread_from = "quick" if comp.runs > 1 else None
    if comp.runs == 1 and full is not None:
        # one distinct quick run measures no seed-to-seed spread: take it from the full result's runs
        try:
            full_comp = components(claim.check, full["arms"], full.get("unit_ids"))
        except (KeyError, ValueError):
            full_comp = None
        if full_comp is not None and full_comp.runs > 1:
            comp = dataclasses.replace(comp, between=full_comp.between)
            spread_from = "full"
    units_full = comp.units_per_run
    if full is not None and claim.check.pairing not in ("seeds", "exactly"):
        try:
            stat = full["arms"][claim.check.method.arm][claim.check.method.metric]
            units_full = float(sum(len(s) for s in stat["unit_values"]) / len(stat["unit_values"]))
        except (KeyError, TypeError, ZeroDivisionError):
            pass
    runs_full = len(paper.modes["full"].seeds)
    effect = min_effect(claim.check)
    if effect is None:  # one ref: the distance quick measured between its estimate and the threshold
        entry = next(c for c in quick["claims"] if c["id"] == claim.id)
        effect = abs(float(entry["estimate"]) - claim.check.threshold) if math.isfinite(entry["estimate"]) else 0.0
    mde = comp.detectable(runs_full, units_full)
    return {"quick_power": comp.power(effect, comp.runs, comp.units_per_run), "full_detectable": mde,
            "min_effect": effect, "enough": mde <= effect, "runs_full": runs_full, "units_full": units_full,
            "seed_spread_from": spread_from, "ratio": claim.check.combine == "/",
            "one_ref": claim.check.baseline is None, "over_seeds": claim.check.pairing == "seeds"}


def _effect_text(x: float, ratio: bool) -> str:
    return f"x{math.exp(x):.3g} (log {x:.3g})" if ratio else f"{x:.3g}"


def render_summary(papers: list[Paper], loaded: Mapping[str, Mapping[str, Any]]) -> str:
    """The README results table: per implemented paper, the headline's full verdict (the decision), quick's
    beside it as a pipeline check with its power, and the evidence tallies."""
    rows = []
    for p in papers:
        if not p.implemented or (p.slug, "quick") not in loaded:
            continue
        quick = loaded[p.slug, "quick"]
        full = loaded.get((p.slug, "full"))
        claim = p.headline
        entry = next((c for c in quick["claims"] if c["id"] == claim.id), None)
        full_entry = next((c for c in full["claims"] if c["id"] == claim.id), None) if full else None
        if entry is None:
            continue
        power = power_statement(p, quick, full)
        quick_cell = _VERDICT_CELL[entry["verdict"]] + (f" (power {power['quick_power']:.2f})" if power else "")
        rows.append([
            f"[`{p.slug}`](src/icml26/{p.slug}/README.md)", claim.text, str(claim.paper),
            f"{claim.check.word} {describe_interval(full_entry)}" if full_entry else "—",
            _headline_cell(full_entry, full), quick_cell, tally(full), tally(quick)])
    if not rows:
        return "_No paper is implemented yet._"
    header = ["paper", "headline claim", "paper's value (where; scale)", "ours, full [one-sided 95 % bounds]",
              "full (the decision)", "quick: pipeline check (power at the minimum effect)",
              "evidence full: holds / inconclusive / fails", "evidence quick"]
    return markdown_table(header, rows) + (
        "\n\nVerdicts come from each card's check: a claim *holds* when its one-sided 95 % confidence bound "
        "clears the card's minimum effect, *fails* when the other bound falls short of it, and is "
        "*inconclusive* otherwise (`icml26.common.claims`); the seed is a training run and its units are "
        "counted as a cluster, each distinct unit once. Full mode decides; quick runs other seeds and checks "
        "the pipeline (its power, from its own variance, is beside it). A headline is *not decidable in this "
        "world* unless every precondition of its mode that gates it holds; a precondition that names the claims "
        "it gates (the premise of those claims only) leaves them out of the tallies where it does not hold. "
        "Sanity checks (true by construction) and "
        "preconditions are shown in the papers' READMEs and not counted. \"(verdicts vN, to be regenerated)\" "
        "marks a result decided by earlier rules that the current ones decide differently (`icml26.common.claims` "
        "lists what each version changed).")


def _gate_text(gate: Mapping[str, Any]) -> str:
    """``"not decidable in this world (oracle inconclusive)"``: the preconditions that do not hold."""
    pending = ", ".join(f"{k} {v}" for k, v in gate["preconditions"].items() if v != "holds")
    return f"not decidable in this world ({pending})"


def render_claims(data: Mapping[str, Any]) -> str:
    rows = []
    gated = data.get("gated", {})
    for c in data["claims"]:
        verdict = _VERDICT_CELL[c["verdict"]]
        if c["id"] in gated and not gated[c["id"]]["decidable"]:
            verdict = f"{_gate_text(gated[c['id']])}; measured: {verdict}"
        kind = c["kind"] + "".join(f"; gates {g}" for g, e in gated.items() if c["id"] in e["preconditions"])
        rows.append([
            c["id"] + (f" ({kind})" if c["kind"] != "evidence" else ""), c["text"],
            f"{c['paper']['value']} ({c['paper']['where']}; {c['paper']['scale']})",
            c["ours"], verdict,
            f"`{c['check']}`: {c['test']}; {c['units']}",
            c["min_effect_why"] or "—", " ".join(c.get("notes", [])) or ""])
    return markdown_table(["claim", "statement", "paper", "ours [one-sided 95 % bounds]", "verdict",
                           "decided by", "why this threshold", "notes"], rows)


def render_power(paper: Paper, loaded: Mapping[tuple[str, str], Mapping[str, Any]]) -> str:
    """One paragraph: the headline's power, from the quick result's variance."""
    power = power_statement(paper, loaded.get((paper.slug, "quick")), loaded.get((paper.slug, "full")))
    if power is None:
        return ""
    ratio = power["ratio"]
    spread = {"quick": "", "full": "; one distinct quick run, so the seed-to-seed spread is the full result's",
              None: "; one distinct quick run and no full spread, so the seed-to-seed spread is taken as 0"}
    text = (f"**Power of the headline** (`{paper.headline.id}`, from the quick result's variance"
            + spread[power["seed_spread_from"]] + "): "
            + ("the quick estimate lies " if power["one_ref"] else "the minimum effect is ")
            + f"{_effect_text(power['min_effect'], ratio)}"
            + (" from the threshold" if power["one_ref"] else "")
            + f", where quick's power is {power['quick_power']:.2f}; the full preset ({power['runs_full']} seed(s)"
            + ("" if power["over_seeds"] else f" x {power['units_full']:.0f} unit(s)") + ") resolves "
            f"{_effect_text(power['full_detectable'], ratio)} with power 0.8"
            + (": enough." if power["enough"] else ", more than that."))
    if not power["enough"]:
        text += (f" Why the full preset is not larger: {paper.headline.power_why}" if paper.headline.power_why
                 else " The card does not yet say why the full preset is not enlarged (`power_why`).")
    return text


def render_paper(paper: Paper, loaded: Mapping[tuple[str, str], Mapping[str, Any]]) -> str:
    """A paper README's generated block: the headline's power, then claims and arms for each mode."""
    parts: list[str] = []
    power = render_power(paper, loaded)
    if power:
        parts.append(power)
    for mode in REPORT_MODES:
        data = loaded.get((paper.slug, mode))
        if data is None:
            continue
        env = data["env"]
        rules = rules_note(data) or f"verdicts v{data['rules']}"
        parts.append(
            f"### {mode} mode — seeds {', '.join(map(str, data['seeds']))}; {data['wall_s']:.0f} s; "
            f"torch {env.get('torch')}, git {str(env.get('git_sha'))[:10]}; {rules}; evidence holds / "
            f"inconclusive / fails: {tally(data)}")
        parts.append(render_claims(data))
        parts.append(render_arms(data["arms"]))
    if not any(k[0] == paper.slug for k in loaded):
        return f"_No results yet: run `icml26 reproduce {paper.slug} --mode quick`._"
    return "\n\n".join(parts)


_ARMS_BLOCK_RE = re.compile(r"<!-- icml26:arms_(\w+):begin -->")


def render_arm_subset(data: Mapping[str, Any], prefix: str) -> str | None:
    """The arms ``prefix`` and ``prefix_*`` of one result with their summary metrics (no ``name/part`` rows), under
    a line naming the mode, seeds and commit; None when no arm matches.

    Example:
        >>> d = {"mode": "full", "seeds": [1], "env": {"git_sha": "abc"}, "arms": {"x": {"m": {"mean": 1.0, "std": 0,
        ...      "values": [1.0]}, "m/a": {"mean": 1.0, "std": 0, "values": [1.0]}}, "y": {}}}
        >>> print(render_arm_subset(d, "x").splitlines()[2])
        | metric | x |
    """
    arms = {a: {k: v for k, v in ms.items() if "/" not in k} for a, ms in data["arms"].items()
            if a == prefix or a.startswith(prefix + "_")}
    if not arms:
        return None
    head = (f"_{data['mode']} mode, seeds {', '.join(map(str, data['seeds']))}, git "
            f"{str(data['env'].get('git_sha'))[:10]} (generated by `icml26 report`)_")
    return head + "\n\n" + render_arms(arms)


def render_arms(arms: Mapping[str, Mapping[str, Any]]) -> str:
    """Every measured value, mean ± std over seeds: one row per metric, one column per arm that has it.

    Metrics measured by disjoint sets of arms go to separate tables, so no table is mostly empty. Metrics
    with per-unit values name their units.
    """
    groups: dict[tuple[str, ...], list[str]] = {}
    for metric in sorted({m for v in arms.values() for m in v}):
        owners = tuple(a for a, v in arms.items() if metric in v)
        groups.setdefault(owners, []).append(metric)
    tables = []
    for owners, metrics in groups.items():
        rows = []
        for m in metrics:
            unit = next((arms[a][m]["unit"] for a in owners if "unit" in arms[a][m]), None)
            label = f"{m} (per {unit[:-1] if unit.endswith('s') else unit})" if unit else m
            rows.append([label] + [describe_stat(arms[a][m]) for a in owners])
        tables.append(markdown_table(["metric", *owners], rows))
    return "\n\n".join(tables)


BENCH_KEYS = ("name", "baseline", "ratio")


def read_bench(path: Path) -> dict[str, Any]:
    """Read and validate ``results/<slug>/bench.json`` (``rows``: name, baseline, ratio, conditions...)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ResultSchemaError(f"{path}: not valid JSON ({exc})") from exc
    rows = data.get("rows") if isinstance(data, Mapping) else None
    if not isinstance(rows, list) or not rows:
        raise ResultSchemaError(f"{path}: needs a non-empty list 'rows'")
    for row in rows:
        if not isinstance(row, Mapping) or any(k not in row for k in BENCH_KEYS):
            raise ResultSchemaError(f"{path}: every row needs {BENCH_KEYS}, got {row!r}")
        if not isinstance(row["ratio"], (int, float)) or isinstance(row["ratio"], bool):
            raise ResultSchemaError(f"{path}: row {row['name']!r}: ratio must be a number")
    return data


def _bench_cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def render_bench(data: Mapping[str, Any]) -> str:
    """A paper README's benchmark block from its ``bench.json``."""
    extra = sorted({k for r in data["rows"] for k in r} - {*BENCH_KEYS, "quantity"})
    header = ["measured", "quantity", "over", "ratio (lower is better)", *extra]
    rows = [[r["name"], r.get("quantity", "time"), r["baseline"], f"{float(r['ratio']):.3g}x",
             *[_bench_cell(r.get(k, "")) for k in extra]] for r in data["rows"]]
    env = data.get("env", {})
    head = (f"`{data.get('command', 'benchmarks/' + str(data.get('slug')) + '.py')}` on {data.get('created', '?')}, "
            f"{env.get('cpu', 'unknown CPU')}, {env.get('threads', '?')} thread(s), git "
            f"{str(env.get('git_sha'))[:10]}; every ratio is measured against its baseline in the same run.")
    if data.get("conditions"):
        head += f" Conditions: {data['conditions']}"
    return head + "\n\n" + markdown_table(header, rows)


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
           papers: list[Paper] | None = None, configs: bool | None = None) -> ReportOutcome:
    """Regenerate every table under ``root`` (or, with ``check``, only list what is stale or wrong).

    Args:
        root: project root (default: ``find_root()``).
        check: change nothing; report stale files in ``outcome.changed``.
        results_dir: default ``root/results``.
        papers: default all registered papers.
        configs: compare each result's config with its experiment's preset (imports every experiment whose
            extras are installed); default: in check mode, when ``papers`` is the registry's.

    In a git checkout with its full history, each paper README also gets its "Card history" block and every
    result is checked against the commit it names; in a shallow clone or outside git both are skipped and
    ``outcome.notices`` says so.
    """
    root = find_root() if root is None else Path(root)
    results = Path(results_dir) if results_dir is not None else root / "results"
    configs = (check and papers is None) if configs is None else configs
    papers = list_papers() if papers is None else papers
    outcome = ReportOutcome()
    problems: list[str] = []
    loaded: dict[tuple[str, str], dict[str, Any]] = {}
    git = Git.find(root) if (root / ".git").exists() else None
    if git is None:
        outcome.notices.append(f"{root} has no full git history here: the card histories and the results' "
                               "commits were not checked")
    for p in papers:
        if not p.implemented:
            continue
        for mode in REPORT_MODES:
            data = _load(results, p, mode, problems, git, configs)
            if data is not None:
                loaded[p.slug, mode] = data
        quick, full = loaded.get((p.slug, "quick")), loaded.get((p.slug, "full"))
        if quick and full:
            shared = sorted(set(quick["seeds"]) & set(full["seeds"]))
            if shared:
                problems.append(f"{p.slug}: quick and full share seeds {shared}; full must replicate on seeds "
                                "of its own (verdicts v3)")
    _update_file(root / "README.md", {"index": render_index(papers),
                                      "results": render_summary(papers, loaded)}, check, outcome)
    for p in papers:
        if not p.implemented:
            continue
        readme = root / "src" / "icml26" / p.slug / "README.md"
        blocks = {"results": render_paper(p, loaded)}
        if git is not None:
            blocks["history"] = render_card_history(card_history(git, p.slug), first_result(git, p.slug))
        bench_path = results / p.slug / "bench.json"
        bench = None
        if bench_path.is_file():
            try:
                bench = read_bench(bench_path)
                blocks["bench"] = render_bench(bench)
            except ResultSchemaError as exc:
                problems.append(str(exc))
            else:
                env = bench.get("env", {})
                if env.get("git_dirty"):
                    files = ", ".join(env.get("git_dirty_files") or []) or "unknown files"
                    problems.append(f"{bench_path} was written from a dirty tree (uncommitted: {files}); rerun "
                                    f"benchmarks/{p.slug}.py from a clean commit")
        elif readme.is_file() and has_block(readme.read_text(encoding="utf-8"), "bench"):
            problems.append(f"{readme} has a benchmark block but {bench_path} is missing; run benchmarks/{p.slug}.py")
        if readme.is_file():
            for prefix in dict.fromkeys(_ARMS_BLOCK_RE.findall(readme.read_text(encoding="utf-8"))):
                data = loaded.get((p.slug, "full")) or loaded.get((p.slug, "quick"))
                table = None if data is None else render_arm_subset(data, prefix)
                if table is None:
                    problems.append(f"{readme}: block arms_{prefix} names no arm of {p.slug}'s results")
                else:
                    blocks[f"arms_{prefix}"] = table
        _update_file(readme, blocks, check, outcome)
        if readme.is_file():
            datas = [d for (slug, _), d in loaded.items() if slug == p.slug] + ([bench] if bench else [])
            allowed = [c.paper.value for c in p.claims] + [c.check.text for c in p.claims] + [
                json.dumps(d.get("config", {})) for d in datas] + [json.dumps(d.get("env", {})) for d in datas]
            typed = typed_numbers(readme.read_text(encoding="utf-8"), _measured_numbers(datas), allowed)
            if typed:
                problems.append(f"{readme}: numbers typed into the prose repeat measured values "
                                f"({', '.join(typed[:8])}); refer to the generated tables instead")
    outcome.problems.extend(dict.fromkeys(problems))  # de-duplicated, in order
    return outcome
