"""The paper registry: reads every ``src/icml26/<slug>/paper.toml`` card.

A card is the declarative description of one paper: number, slug, title, venue, kind, the component's import
path, extras, status (``planned`` until implemented), run modes with seeds and time budgets, and the claims
with the paper's value (where reported, at what scale) and the check that decides whether each holds
(see ``icml26.common.claims``).

Example:
    >>> p = get_paper("shampoo")
    >>> p.number, p.slug
    (5, 'shampoo')
    >>> len(list_papers())
    19
"""

from __future__ import annotations

import difflib
import fnmatch
import functools
import importlib
import importlib.metadata
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .common.claims import CLAIM_KINDS, Check, parse_check

PACKAGE_DIR = Path(__file__).resolve().parent
STATUSES = ("planned", "implemented")
KINDS = (
    "optimizer", "estimator", "flower-strategy", "trl-loss", "trl-trainer", "hf-trainer", "nn-module",
    "pettingzoo-env", "agent-middleware", "logits-processor", "solver", "online-learner", "constructor", "flower-app",
    "intervention", "attack",
)
#: the extras of pyproject.toml: ecosystem building blocks, then one per paper (its slug with "-" for "_")
EXTRAS = (
    "torch", "fl", "hf", "agents", "agents-langchain", "agents-mcp", "agents-dojo", "agents-llm", "vq", "audio",
    "rl", "xai", "milp", "bench",
    "air", "fedit", "audio-watermark", "moda", "shampoo", "branch-and-cut", "gcpa", "xfedalign", "regret-po",
    "align-ti", "sarl", "float-networks", "inverse-optimization", "coca", "fedtreelora", "spard", "ps-ppo",
    "vq-rank", "unsafe-moe",
)


def paper_extra(slug: str) -> str:
    """The pip extra of a paper: ``pip install "icml26[<paper_extra(slug)>]"``."""
    return slug.replace("_", "-")
DIRECTIONS = ("higher", "lower")


class CardError(ValueError):
    """A ``paper.toml`` card is malformed; the message names the file and the field."""


class UnknownPaperError(KeyError):
    """No paper has this slug; ``suggestions`` holds close matches."""

    def __init__(self, slug: str, suggestions: list[str]):
        self.slug = slug
        self.suggestions = suggestions
        hint = f"; did you mean {', '.join(suggestions)}?" if suggestions else ""
        super().__init__(f"unknown paper {slug!r}{hint} (`icml26 list` shows all nineteen)")

    def __str__(self) -> str:  # KeyError quotes its message otherwise
        return str(self.args[0])


@dataclass(frozen=True)
class PaperValue:
    """The paper's number for a claim, where it is reported, and at what scale."""

    value: str
    where: str
    scale: str

    def __str__(self) -> str:
        return f"{self.value} ({self.where}; {self.scale})"

    def as_dict(self) -> dict[str, str]:
        return {"value": self.value, "where": self.where, "scale": self.scale}


@dataclass(frozen=True)
class Claim:
    """One claim of a paper and the check that decides whether it holds in our runs."""

    id: str
    text: str
    metric: str
    direction: str
    paper: PaperValue
    check: Check
    modes: tuple[str, ...]
    headline: bool = False
    kind: str = "evidence"
    """``evidence`` (a measurement of the method, counted in the verdict tallies), ``precondition`` (a
    measurement that establishes the world's premise: the headline is decidable only when every precondition
    holds) or ``sanity`` (arithmetic, or true by the construction of the code; shown, not counted)"""
    min_effect_why: str = ""
    """why the check's threshold is the smallest effect that matters (chosen before the run)"""
    power_why: str = ""
    """headline only: why the full preset cannot reach power 0.8 at the minimum effect, where it cannot"""
    gates: tuple[str, ...] = ()
    """precondition only: the evidence claims whose premise it establishes (each is decidable only where it
    holds). Empty: it gates the headline, as every precondition did before scoped gates existed"""

    def gated(self, claim_id: str, headline_id: str) -> bool:
        """Whether this precondition gates claim ``claim_id`` (``headline_id``: the card's headline)."""
        return self.kind == "precondition" and claim_id in (self.gates or (headline_id,))


@dataclass(frozen=True)
class Mode:
    """A run preset: default seeds and the wall-time budget on the project's 2-core machine."""

    name: str
    seeds: tuple[int, ...]
    budget_s: float


@dataclass(frozen=True)
class Paper:
    """A parsed ``paper.toml`` card."""

    number: int
    slug: str
    title: str
    short: str
    venue: str
    authors: str
    url: str
    code: str
    kind: str
    component: str
    extras: tuple[str, ...]
    component_extras: tuple[str, ...]
    status: str
    issue: int | None
    summary: str
    reconstructed: str
    modes: dict[str, Mode]
    claims: tuple[Claim, ...]
    path: Path

    @property
    def implemented(self) -> bool:
        return self.status == "implemented"

    @property
    def folder(self) -> Path:
        return self.path.parent

    @property
    def headline(self) -> Claim:
        """The claim shown in the top-level README (the one marked ``headline``, else the first evidence claim)."""
        for claim in self.claims:
            if claim.headline:
                return claim
        return next((c for c in self.claims if c.kind == "evidence"), self.claims[0])

    def claims_for(self, mode: str) -> tuple[Claim, ...]:
        """The claims evaluated in ``mode``."""
        return tuple(c for c in self.claims if mode in c.modes)

    def resolve_component(self) -> Any:
        """Import and return the component object named by ``component`` (``"module:attr"``)."""
        module_name, _, attr = self.component.partition(":")
        module = importlib.import_module(module_name)
        return getattr(module, attr) if attr else module


def _req(table: dict[str, Any], key: str, typ: type | tuple[type, ...], where: str) -> Any:
    if key not in table:
        raise CardError(f"{where}: missing field {key!r}")
    value = table[key]
    if not isinstance(value, typ) or (isinstance(value, bool) and typ is not bool):
        names = typ.__name__ if isinstance(typ, type) else " or ".join(t.__name__ for t in typ)
        raise CardError(f"{where}: field {key!r} must be {names}, got {type(value).__name__}")
    return value


def _str_list(table: dict[str, Any], key: str, where: str, allowed: tuple[str, ...] | None = None) -> tuple[str, ...]:
    value = table.get(key, [])
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise CardError(f"{where}: field {key!r} must be a list of strings")
    if allowed is not None:
        bad = [v for v in value if v not in allowed]
        if bad:
            raise CardError(f"{where}: field {key!r} has unknown values {bad}; allowed: {list(allowed)}")
    return tuple(value)


def load_card(path: str | Path) -> Paper:
    """Parse and validate one ``paper.toml``.

    Raises:
        CardError: a field is missing, has the wrong type or an unknown value, or a check does not parse.
    """
    path = Path(path)
    where = str(path)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise CardError(f"{where}: invalid TOML ({exc})") from exc
    number = _req(data, "number", int, where)
    slug = _req(data, "slug", str, where)
    if slug != path.parent.name:
        raise CardError(f"{where}: slug {slug!r} must equal the folder name {path.parent.name!r}")
    kind = _req(data, "kind", str, where)
    if kind not in KINDS:
        raise CardError(f"{where}: kind {kind!r} is not one of {list(KINDS)}")
    status = _req(data, "status", str, where)
    if status not in STATUSES:
        raise CardError(f"{where}: status {status!r} is not one of {list(STATUSES)}")
    component = _req(data, "component", str, where)
    if not component.startswith(f"icml26.{slug}"):
        raise CardError(f"{where}: component {component!r} must live under icml26.{slug}")
    issue = data.get("issue")
    if issue is not None and (not isinstance(issue, int) or isinstance(issue, bool)):
        raise CardError(f"{where}: field 'issue' must be an int")

    modes_table = _req(data, "modes", dict, where)
    modes: dict[str, Mode] = {}
    for name in ("smoke", "quick", "full"):
        mw = f"{where} [modes.{name}]"
        table = _req(modes_table, name, dict, where)
        seeds = table.get("seeds")
        if not isinstance(seeds, list) or not seeds or not all(
            isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in seeds
        ):
            raise CardError(f"{mw}: seeds must be a non-empty list of non-negative ints")
        budget = _req(table, "budget_s", (int, float), mw)
        if budget <= 0:
            raise CardError(f"{mw}: budget_s must be positive")
        modes[name] = Mode(name, tuple(seeds), float(budget))

    claims_data = data.get("claims")
    if not isinstance(claims_data, list) or not claims_data:
        raise CardError(f"{where}: needs at least one [[claims]] table")
    claims: list[Claim] = []
    seen: set[str] = set()
    for i, c in enumerate(claims_data):
        cw = f"{where} [[claims]] #{i + 1}"
        cid = _req(c, "id", str, cw)
        if cid in seen:
            raise CardError(f"{cw}: duplicate claim id {cid!r}")
        seen.add(cid)
        direction = _req(c, "direction", str, cw)
        if direction not in DIRECTIONS:
            raise CardError(f"{cw}: direction must be one of {list(DIRECTIONS)}")
        paper = _req(c, "paper", dict, cw)
        pv = PaperValue(*(str(_req(paper, k, (str, int, float), f"{cw} paper")) for k in ("value", "where", "scale")))
        try:
            check = parse_check(_req(c, "check", str, cw))
        except ValueError as exc:
            raise CardError(f"{cw}: {exc}") from exc
        claim_modes = _str_list(c, "modes", cw, allowed=tuple(modes)) or tuple(modes)
        ckind = c.get("kind", "evidence")
        if ckind not in CLAIM_KINDS:
            raise CardError(f"{cw}: kind must be one of {list(CLAIM_KINDS)}, got {ckind!r}")
        why = c.get("min_effect_why", "")
        if not isinstance(why, str):
            raise CardError(f"{cw}: min_effect_why must be a string")
        power_why = c.get("power_why", "")
        if not isinstance(power_why, str):
            raise CardError(f"{cw}: power_why must be a string")
        if power_why and not c.get("headline", False):
            raise CardError(f"{cw}: power_why belongs to the headline claim")
        gates = _str_list(c, "gates", cw)
        if gates and ckind != "precondition":
            raise CardError(f"{cw}: gates belongs to a precondition (the claims whose premise it establishes)")
        if ckind in ("evidence", "precondition"):
            if not why.strip():
                raise CardError(f"{cw}: an {ckind} claim needs min_effect_why: why its threshold is the "
                                "smallest effect a user would care about, chosen before the run")
            neutral = 1.0 if check.combine == "/" else 0.0
            if check.comparative and not check.equivalence and check.threshold == neutral:
                raise CardError(f"{cw}: a comparative evidence claim needs a minimum effect; threshold "
                                f"{check.threshold:g} is no effect (mark it kind = \"sanity\" if it holds by "
                                "construction)")
        claims.append(Claim(id=cid, text=_req(c, "text", str, cw), metric=_req(c, "metric", str, cw),
                            direction=direction, paper=pv, check=check, modes=claim_modes,
                            headline=bool(c.get("headline", False)), kind=ckind, min_effect_why=why.strip(),
                            power_why=power_why.strip(), gates=gates))
    by_id = {c.id: c for c in claims}
    for c in claims:
        for g in c.gates:
            target = by_id.get(g)
            if target is None or target.kind != "evidence" or g == c.id:
                raise CardError(f"{where}: precondition {c.id!r} gates {g!r}, which is not an evidence claim of "
                                "this card")
    if sum(c.headline for c in claims) > 1:
        raise CardError(f"{where}: at most one claim may set headline = true")
    if any(c.headline and c.kind != "evidence" for c in claims):
        raise CardError(f"{where}: the headline claim must be evidence, not a sanity check or a precondition")

    return Paper(
        number=number, slug=slug, title=_req(data, "title", str, where), short=_req(data, "short", str, where),
        venue=_req(data, "venue", str, where), authors=data.get("authors", ""), url=_req(data, "url", str, where),
        code=data.get("code", "none known"), kind=kind, component=component,
        extras=_str_list(data, "extras", where, EXTRAS),
        component_extras=_str_list(data, "component_extras", where, EXTRAS),
        status=status, issue=issue, summary=_req(data, "summary", str, where).strip(),
        reconstructed=str(data.get("reconstructed", "")).strip(), modes=modes, claims=tuple(claims), path=path,
    )


@functools.cache
def _all_papers() -> tuple[Paper, ...]:
    papers = [load_card(p) for p in sorted(PACKAGE_DIR.glob("*/paper.toml"))]
    numbers = [p.number for p in papers]
    if len(set(numbers)) != len(numbers):
        raise CardError(f"duplicate paper numbers in cards: {sorted(numbers)}")
    return tuple(sorted(papers, key=lambda p: p.number))


def list_papers(pattern: str | None = None) -> list[Paper]:
    """All papers by number, or those whose slug, number or title matches ``pattern``.

    ``pattern`` is a glob on the slug (``"fed*"``) or a case-insensitive substring of slug or title.
    """
    papers = list(_all_papers())
    if not pattern:
        return papers
    pat = pattern.lower()
    return [
        p for p in papers
        if fnmatch.fnmatch(p.slug, pat) or pat in p.slug or pat in p.title.lower() or pat in p.short.lower()
        or pat == str(p.number) or pat == f"{p.number:02d}"
    ]


def get_paper(slug: str) -> Paper:
    """The paper with this slug; raises ``UnknownPaperError`` (a ``KeyError``) with close matches."""
    if not isinstance(slug, str):
        raise TypeError(f"slug must be a string, got {type(slug).__name__}")
    for p in _all_papers():
        if p.slug == slug:
            return p
    slugs = [p.slug for p in _all_papers()]
    suggestions = difflib.get_close_matches(slug, slugs, n=3, cutoff=0.6)
    suggestions += [s for s in slugs if slug and slug.lower() in s and s not in suggestions]
    raise UnknownPaperError(slug, suggestions[:3])


def extra_requirements(extra: str) -> list[str]:
    """Distribution names that ``icml26[extra]`` requires, read from the installed metadata; extras that
    name other extras (``icml26[torch]``) are followed."""
    from packaging.requirements import Requirement

    try:
        reqs = [Requirement(raw) for raw in importlib.metadata.requires("icml26") or []]
    except importlib.metadata.PackageNotFoundError:
        return []
    names: list[str] = []
    todo, seen = [extra], set()
    while todo:
        current = todo.pop()
        if current in seen:
            continue
        seen.add(current)
        for req in reqs:
            if req.marker is None or not req.marker.evaluate({"extra": current}) or req.marker.evaluate(
                    {"extra": ""}):
                continue
            if req.name == "icml26":
                todo.extend(sorted(req.extras))
            elif req.name not in names:
                names.append(req.name)
    return names


#: system programs (Debian package = program name) an extra needs on PATH besides its Python distributions
SYSTEM_PROGRAMS: dict[str, tuple[str, ...]] = {"audio-watermark": ("espeak-ng", "lame")}


def missing_programs(paper: Paper, which: str = "extras") -> dict[str, list[str]]:
    """``{extra: [system programs not on PATH]}`` for the extras ``paper`` needs (see ``SYSTEM_PROGRAMS``)."""
    import shutil

    out: dict[str, list[str]] = {}
    for extra in getattr(paper, which):
        missing = [p for p in SYSTEM_PROGRAMS.get(extra, ()) if shutil.which(p) is None]
        if missing:
            out[extra] = missing
    return out


def missing_extras(paper: Paper, which: str = "extras") -> dict[str, list[str]]:
    """``{extra: [missing distributions]}`` for the extras ``paper`` needs (``which``: extras or component_extras)."""
    out: dict[str, list[str]] = {}
    for extra in getattr(paper, which):
        missing = []
        for dist in extra_requirements(extra):
            try:
                importlib.metadata.version(dist)
            except importlib.metadata.PackageNotFoundError:
                missing.append(dist)
        if missing:
            out[extra] = missing
    return out
