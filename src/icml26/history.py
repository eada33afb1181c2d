"""What git remembers about a paper: its card's changes after its first result, and whether a result's
recorded provenance is true of the commit it names.

``card_history(slug)`` lists every change to a claim's decision (its check's threshold, comparison, test or
units; its direction, headline flag, kind, modes or gates) and to a mode's seeds made in a commit after the paper's
first committed result, and every change of a quick or full preset (the settings its committed results store), with the verdicts of the committed quick and full results just before the change and
at the first result written at or after it. ``icml26 report`` renders it as each paper's "Card history";
nobody writes it by hand.

``provenance_problems(...)`` checks a result against git: its ``env.git_sha`` is a commit on this branch, the
card and every hashed source file at that commit hash as the result says (a forged or stale hash fails).

Both need the repository's history; in a shallow clone or outside git they return ``None``, and the report says
the history checks were skipped.

Example:
    >>> repo = Git.find()
    >>> repo is None or isinstance(repo.head(), str)
    True
"""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .common.claims import parse_check

#: the fields of a claim whose change can move its verdict
DECISION_FIELDS = ("threshold", "comparison", "test", "units", "direction", "headline", "kind", "modes", "gates")
_CHECK_PARTS = re.compile(r"(?P<op>>=|<=|>|<)\s*(?P<threshold>[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?)")


class Git:
    """A read-only view of the repository at ``root`` (``git`` on the PATH)."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self._cache: dict[tuple[str, str], bytes | None] = {}
        self._parsed: dict[tuple[str, str], dict[str, Any]] = {}  # _result_at's parsed results

    @classmethod
    def find(cls, start: str | Path | None = None) -> Git | None:
        """The repository holding ``start`` (default: this package), or ``None`` when there is no full history."""
        where = Path(start) if start is not None else Path(__file__).resolve().parent
        try:
            top = _run(["git", "rev-parse", "--show-toplevel"], where).strip()
            shallow = _run(["git", "rev-parse", "--is-shallow-repository"], where).strip()
        except (OSError, subprocess.SubprocessError):
            return None
        if not top or shallow == "true":
            return None
        return cls(Path(top))

    def run(self, *args: str) -> str:
        return _run(["git", *args], self.root)

    def head(self) -> str:
        return self.run("rev-parse", "HEAD").strip()

    def show(self, sha: str, path: str) -> bytes | None:
        """The bytes of ``path`` at commit ``sha``, or ``None`` if it did not exist there."""
        key = (sha, path)
        if key not in self._cache:
            try:
                self._cache[key] = subprocess.run(["git", "show", f"{sha}:{path}"], cwd=self.root,
                                                  capture_output=True, timeout=30, check=True).stdout
            except subprocess.CalledProcessError:
                self._cache[key] = None
        return self._cache[key]

    def is_commit_on_branch(self, sha: str) -> bool:
        """``sha`` names a commit that is HEAD or one of its ancestors."""
        if not re.fullmatch(r"[0-9a-f]{7,40}", sha or ""):
            return False
        ok = subprocess.run(["git", "merge-base", "--is-ancestor", sha, "HEAD"], cwd=self.root,
                            capture_output=True, timeout=30)
        return ok.returncode == 0

    def commits(self, *paths: str, since: str | None = None) -> list[tuple[str, str, str]]:
        """``(sha, date, subject)`` of the commits touching ``paths``, oldest first (after ``since`` if given)."""
        rng = [f"{since}..HEAD"] if since else ["HEAD"]
        out = self.run("log", "--reverse", "--format=%H%x09%ad%x09%s", "--date=short", *rng, "--", *paths)
        return [tuple(line.split("\t", 2)) for line in out.splitlines() if line.strip()]  # type: ignore[misc]

    def order(self) -> dict[str, int]:
        """Position of every commit of HEAD's history, oldest first."""
        return {sha: i for i, sha in enumerate(self.run("rev-list", "--reverse", "HEAD").split())}


def _run(cmd: list[str], cwd: Path) -> str:
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=60, check=True).stdout


# -- the card history -----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class CardChange:
    """One change to a claim's decision (or a mode's seeds) after the paper's first result."""

    sha: str
    date: str
    subject: str
    claim: str
    field: str
    old: str
    new: str
    looser: bool | None
    """True when the change makes "holds" easier (a threshold moved toward the estimate's side), False when
    harder, None when neither applies"""
    verdicts: dict[str, tuple[str, str]]
    """``{mode: (verdict before, verdict at the first result at or after the change)}``"""


def _decision(claim: Mapping[str, Any]) -> dict[str, str]:
    """A card claim's decision fields as strings (old card grammars parse by pattern)."""
    check = str(claim.get("check", ""))
    try:
        c = parse_check(check)
        threshold, comparison = f"{c.threshold:g}", c.op
        test = c.procedure or "default"
        units = "exactly" if c.deterministic else c.pairing + (" in retrained runs" if c.retrained else "")
        quantity = c.quantity_name
    except ValueError:
        m = _CHECK_PARTS.search(check)
        threshold, comparison = (f"{float(m['threshold']):g}", m["op"]) if m else ("?", "?")
        test, units, quantity = "(older grammar)", check, check.split(comparison)[0].strip() if m else check
    return {"threshold": threshold, "comparison": f"{quantity} {comparison}", "test": test, "units": units,
            "direction": str(claim.get("direction", "")), "headline": str(bool(claim.get("headline", False))),
            "kind": str(claim.get("kind", "evidence")), "modes": ",".join(claim.get("modes", []) or ["all"]),
            "gates": ",".join(claim.get("gates", []))}


def _looser(field: str, old: str, new: str, op: str) -> bool | None:
    if field != "threshold":
        return None
    try:
        a, b = float(old), float(new)
    except ValueError:
        return None
    if a == b:
        return None
    if ">" in op:
        return b < a
    if "<" in op:
        return b > a
    return None


def _card(git: Git, sha: str, path: str) -> dict[str, Any] | None:
    raw = git.show(sha, path)
    if raw is None:
        return None
    try:
        return tomllib.loads(raw.decode("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError):
        return None


def _verdict_at(git: Git, sha: str, slug: str, mode: str, claim: str) -> str:
    data = _result_at(git, sha, f"results/{slug}/{mode}.json")
    if not data:
        return "—"
    for c in data.get("claims", []):
        if c.get("id") == claim:
            if "verdict" in c:
                return str(c["verdict"])
            return "holds" if c.get("holds") else "not holds"
    return "—"


def card_history(git: Git, slug: str) -> list[CardChange]:
    """Every change to ``slug``'s claims' decisions and modes' seeds after its first committed result, and every
    change of its quick and full presets (:func:`preset_changes`), oldest first."""
    card_path = f"src/icml26/{slug}/paper.toml"
    result_paths = [f"results/{slug}/{m}.json" for m in ("quick", "full")]
    results = git.commits(*result_paths)
    if not results:
        return []
    first = results[0][0]
    order = git.order()
    by_mode = {m: [sha for sha, _, _ in git.commits(f"results/{slug}/{m}.json")] for m in ("quick", "full")}
    out: list[CardChange] = []
    for sha, date, subject in git.commits(card_path, since=first):
        old, new = _card(git, f"{sha}^", card_path), _card(git, sha, card_path)
        if old is None or new is None:
            continue
        changes: list[tuple[str, str, str, str, str]] = []  # claim, field, old, new, op
        old_claims = {c.get("id"): c for c in old.get("claims", [])}
        new_claims = {c.get("id"): c for c in new.get("claims", [])}
        for cid in list(old_claims) + [c for c in new_claims if c not in old_claims]:
            if cid not in new_claims:
                changes.append((cid, "claim", str(old_claims[cid].get("check")), "(removed)", ""))
                continue
            if cid not in old_claims:
                changes.append((cid, "claim", "(none)", str(new_claims[cid].get("check")), ""))
                continue
            a, b = _decision(old_claims[cid]), _decision(new_claims[cid])
            for f in DECISION_FIELDS:
                if a[f] != b[f]:
                    changes.append((cid, f, a[f], b[f], b["comparison"]))
        for mode in ("smoke", "quick", "full"):
            sa = old.get("modes", {}).get(mode, {}).get("seeds")
            sb = new.get("modes", {}).get(mode, {}).get("seeds")
            if sa != sb and mode != "smoke":
                changes.append((f"(seeds, {mode})", "seeds", str(sa), str(sb), ""))
        for cid, field, a, b, op in changes:
            verdicts = {}
            claim_id = cid if not cid.startswith("(") else ""
            for mode in ("quick", "full"):
                if not claim_id:
                    continue
                before = _verdict_at(git, f"{sha}^", slug, mode, claim_id)
                after_sha = next((r for r in by_mode[mode] if order.get(r, -1) >= order.get(sha, 0)), None)
                after = _verdict_at(git, after_sha, slug, mode, claim_id) if after_sha else "(no result since)"
                verdicts[mode] = (before, after)
            out.append(CardChange(sha, date, subject, cid, field, a, b, _looser(field, a, b, op), verdicts))
    out.extend(preset_changes(git, slug))
    # oldest first; a preset change sits at the result commit that first ran the new preset
    return sorted(out, key=lambda c: order.get(c.sha, -1))


def _result_at(git: Git, sha: str, path: str) -> dict[str, Any]:
    """The committed result at ``path`` in commit ``sha`` (``{}`` when absent or unreadable), parsed once per
    ``git`` (a card's history reads the same result for every claim change and mode: read-only for callers)."""
    key = (sha, path)
    if key not in git._parsed:
        raw = git.show(sha, path)
        try:
            data = json.loads(raw) if raw is not None else {}
        except json.JSONDecodeError:
            data = {}
        git._parsed[key] = data if isinstance(data, dict) else {}
    return git._parsed[key]


_MISSING = object()


def config_diff(old: Mapping[str, Any], new: Mapping[str, Any], width: int = 60) -> list[tuple[str, str, str]]:
    """``(key, old, new)`` for every preset setting that differs between two stored configs, values as compact
    JSON cut to ``width`` characters (``(none)`` for a setting one side lacks).

    Example:
        >>> config_diff({"budget": 24000, "lr": 0.001}, {"budget": 48000, "lr": 0.001, "lr_end_frac": 0.0})
        [('budget', '24000', '48000'), ('lr_end_frac', '(none)', '0.0')]
    """

    def show(v: Any) -> str:
        text = json.dumps(v, sort_keys=True, separators=(",", ":"))
        return text if len(text) <= width else text[: width - 1] + "…"

    keys = list(old) + [k for k in new if k not in old]
    return [(k, show(old[k]) if k in old else "(none)", show(new[k]) if k in new else "(none)")
            for k in keys if old.get(k, _MISSING) != new.get(k, _MISSING)]


def preset_changes(git: Git, slug: str) -> list[CardChange]:
    """Every change of a quick or full preset (the ``config`` a committed result stores) after the paper's first
    committed result: one row per result commit whose config differs from the previous committed result's of the
    same mode, with the headline's verdict in the previous result and in this one."""
    out: list[CardChange] = []
    for mode in ("quick", "full"):
        path = f"results/{slug}/{mode}.json"
        prev: tuple[str, dict[str, Any]] | None = None
        for sha, date, subject in git.commits(path):
            data = _result_at(git, sha, path)
            cfg = data.get("config")
            if not isinstance(cfg, dict):
                continue
            if prev is not None and cfg != prev[1]:
                diff = config_diff(prev[1], cfg)
                head = next((str(c["id"]) for c in data.get("claims", []) if c.get("headline") and "id" in c), None)
                verdicts = ({mode: (_verdict_at(git, prev[0], slug, mode, head),
                                    _verdict_at(git, sha, slug, mode, head))} if head else {})
                what = "; ".join(f"{k}: `{a}` → `{b}`" for k, a, b in diff)
                out.append(CardChange(sha, date, subject, f"(preset, {mode})", "preset", "", what, None,
                                      verdicts))
            prev = (sha, cfg)
    return out


def render_card_history(changes: list[CardChange], first_result: str | None) -> str:
    """The Markdown table of ``card_history``."""
    from .common.results import markdown_table

    if not changes:
        since = f" (first result: {first_result[:10]})" if first_result else ""
        return f"_No change to a claim's decision, a mode's seeds or a preset since the first committed result{since}._"
    grouped: dict[tuple[str, str], list[CardChange]] = {}
    for c in changes:
        grouped.setdefault((c.sha, c.claim), []).append(c)
    rows = []
    for (sha, claim), group in grouped.items():
        head = group[0]
        what = "; ".join(c.new if c.field == "preset" else f"{c.field}: `{c.old}` → `{c.new}`" for c in group)
        marks = {c.looser for c in group} - {None}
        effect = "looser" if marks == {True} else "stricter" if marks == {False} else "mixed" if marks else ""
        verdicts = "; ".join(f"{m}: {a} → {b}" for m, (a, b) in head.verdicts.items()) or "—"
        rows.append([f"`{sha[:10]}` {head.date}", claim, what, effect, verdicts,
                     head.subject[:140] + ("…" if len(head.subject) > 140 else "")])
    return ("Generated from git by `icml26 report`: every change to a claim's threshold, comparison, test, units, "
            "direction, headline flag, kind, modes or gates (the claims a precondition gates), and to a mode's seeds, made after this paper's first "
            "committed result; the verdicts are those of the committed results just before the change and at "
            "the first result written at or after it. Rows `(preset, MODE)` are changes of a mode's preset "
            "(the settings its committed result stores), at the result commit that first ran it, with the "
            "headline's verdict before and after. \"looser\" marks a threshold moved so that *holds* is "
            "easier.\n\n"
            + markdown_table(["commit", "claim", "change", "", "verdicts (before → after)", "commit message"], rows))


def first_result(git: Git, slug: str) -> str | None:
    commits = git.commits(*(f"results/{slug}/{m}.json" for m in ("quick", "full")))
    return commits[0][0] if commits else None


# -- provenance against git -----------------------------------------------------------------------------------
def provenance_problems(git: Git, slug: str, data: Mapping[str, Any], path: str) -> list[str]:
    """What a result claims about its commit that git does not confirm."""
    sha = str(data.get("env", {}).get("git_sha") or "")
    if not git.is_commit_on_branch(sha):
        return [f"{path}: env.git_sha {sha[:12] or '(none)'} is not a commit of this branch's history"]
    out = []
    card = git.show(sha, f"src/icml26/{slug}/paper.toml")
    prov = data.get("provenance", {})
    if card is None or hashlib.sha256(card).hexdigest() != prov.get("card_sha256"):
        out.append(f"{path}: card_sha256 is not the hash of the card at {sha[:10]}")
    forged = [p for p, h in prov.get("sources", {}).items()
              if (raw := git.show(sha, f"src/icml26/{p}")) is None or hashlib.sha256(raw).hexdigest() != h]
    if forged:
        out.append(f"{path}: source hashes that are not those of commit {sha[:10]}: {', '.join(sorted(forged)[:5])}")
    return out


def card_at(git: Git, sha: str, slug: str) -> dict[str, Any] | None:
    """The parsed card of ``slug`` at commit ``sha``."""
    return _card(git, sha, f"src/icml26/{slug}/paper.toml")


def decision_of(card: Mapping[str, Any], claim_id: str) -> dict[str, str] | None:
    """The decision fields of one claim of a parsed card (``None`` if the card has no such claim)."""
    claim = next((c for c in card.get("claims", []) if c.get("id") == claim_id), None)
    return None if claim is None else _decision(claim)
