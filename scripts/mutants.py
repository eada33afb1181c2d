"""Mutation check: plant each paper's listed plausible bugs, one at a time, and require its fast tests to fail.

Each paper lists its mutants in ``tests/<slug>/mutants.toml``::

    [[mutant]]
    name = "noise_not_scaled_by_sensitivity"        # unique within the paper
    file = "src/icml26/xfedalign/core.py"           # relative to the repository root
    find = "scale = sensitivity / epsilon"           # exact text; must occur exactly once in the file
    replace = "scale = 1.0 / epsilon"
    why = "the artifact's privacy rests on the noise scale"   # what a user loses if this bug ships
    tests = ["tests/xfedalign/test_core.py"]          # optional: the tests to run (default: tests/<slug>)

For each mutant the script copies ``src/``, ``tests/`` and ``pyproject.toml`` into a temporary directory,
applies the one edit there (never in this checkout), and runs ``pytest -x -m "not slow"`` on the named tests
with ``PYTHONPATH`` pointing at the copy's ``src`` (ahead of the editable install). A mutant is **killed** when
pytest reports a failure or error, or runs past ``--timeout``; it **survives** when the tests pass. A mutant
whose ``find`` text is missing or not unique is **stale**: the mutants file no longer describes the code.
Survivors and stale mutants make the exit status 1.

Run::

    .venv/bin/python scripts/mutants.py xfedalign fedtreelora     # named papers
    .venv/bin/python scripts/mutants.py --all                       # every paper with a mutants file
    .venv/bin/python scripts/mutants.py xfedalign --only noise_not_scaled_by_sensitivity

It runs in the slow tier (``tests/test_mutants.py``) and before a regeneration (``scripts/regenerate.py``).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REQUIRED = ("name", "file", "find", "replace", "why")
#: what a paper's mutants file must hold at the least (issue #46)
MIN_MUTANTS = 5


@dataclass(frozen=True)
class Mutant:
    """One planted bug: replace ``find`` (exactly one occurrence) by ``replace`` in ``file``."""

    slug: str
    name: str
    file: str
    find: str
    replace: str
    why: str
    tests: tuple[str, ...] = field(default=())


@dataclass(frozen=True)
class Outcome:
    mutant: Mutant
    status: str  # "killed", "survived", "stale", "timeout"
    seconds: float
    detail: str = ""


def mutants_file(slug: str, root: Path = ROOT) -> Path:
    return root / "tests" / slug / "mutants.toml"


def papers_with_mutants(root: Path = ROOT) -> list[str]:
    return sorted(p.parent.name for p in (root / "tests").glob("*/mutants.toml"))


def load(slug: str, root: Path = ROOT) -> list[Mutant]:
    """The mutants of ``slug``, validated: required keys, unique names, files inside ``src/``, tests that exist."""
    path = mutants_file(slug, root)
    if not path.is_file():
        raise FileNotFoundError(f"{slug}: no mutants file {path}")
    with path.open("rb") as fh:
        data = tomllib.load(fh)
    entries = data.get("mutant")
    if not isinstance(entries, list) or not entries:
        raise ValueError(f"{path}: no [[mutant]] entries")
    out: list[Mutant] = []
    names: set[str] = set()
    for i, entry in enumerate(entries):
        missing = [k for k in REQUIRED if not isinstance(entry.get(k), str) or not entry[k]]
        if missing:
            raise ValueError(f"{path}: mutant #{i + 1} lacks {', '.join(missing)}")
        unknown = sorted(set(entry) - set(REQUIRED) - {"tests"})
        if unknown:
            raise ValueError(f"{path}: mutant {entry['name']!r} has unknown keys {unknown}")
        if entry["name"] in names:
            raise ValueError(f"{path}: mutant name {entry['name']!r} repeats")
        names.add(entry["name"])
        if entry["find"] == entry["replace"]:
            raise ValueError(f"{path}: mutant {entry['name']!r} changes nothing")
        if not entry["file"].startswith("src/icml26/"):
            raise ValueError(f"{path}: mutant {entry['name']!r}: file must be under src/icml26/")
        tests = tuple(entry.get("tests") or (f"tests/{slug}",))
        for t in tests:
            if not (root / t.split("::")[0]).exists():
                raise ValueError(f"{path}: mutant {entry['name']!r}: no test path {t}")
        out.append(Mutant(slug, entry["name"], entry["file"], entry["find"], entry["replace"], entry["why"], tests))
    return out


def _copy_tree(dest: Path, root: Path) -> None:
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", ".pytest_cache")
    shutil.copytree(root / "src", dest / "src", ignore=ignore)
    shutil.copytree(root / "tests", dest / "tests", ignore=ignore)
    shutil.copy2(root / "pyproject.toml", dest / "pyproject.toml")


def run_one(mutant: Mutant, *, root: Path = ROOT, timeout: float = 600.0) -> Outcome:
    """Apply ``mutant`` in a fresh copy of the tree and run its tests there."""
    t0 = time.time()
    source = (root / mutant.file).read_text(encoding="utf-8")
    count = source.count(mutant.find)
    if count != 1:
        return Outcome(mutant, "stale", 0.0, f"find text occurs {count} times in {mutant.file}")
    with tempfile.TemporaryDirectory(prefix=f"icml26-mutant-{mutant.slug}-") as tmp:
        work = Path(tmp)
        _copy_tree(work, root)
        (work / mutant.file).write_text(source.replace(mutant.find, mutant.replace), encoding="utf-8")
        env = {**os.environ, "PYTHONPATH": str(work / "src"), "OMP_NUM_THREADS": "1", "ICML26_PROGRESS": "0",
               "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
        cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "-m", "not slow",
               "--no-header", *mutant.tests]
        try:
            proc = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return Outcome(mutant, "timeout", time.time() - t0, f"tests ran past {timeout:.0f} s")
    tail = (proc.stdout + proc.stderr).strip().splitlines()[-1:] or [""]
    if proc.returncode == 0:
        return Outcome(mutant, "survived", time.time() - t0, tail[0])
    if proc.returncode == 5:  # pytest: no tests collected
        return Outcome(mutant, "stale", time.time() - t0, f"no tests collected from {' '.join(mutant.tests)}")
    return Outcome(mutant, "killed", time.time() - t0, tail[0])


def check(slugs: list[str], *, only: set[str] | None = None, root: Path = ROOT, timeout: float = 600.0,
          echo: bool = True) -> list[Outcome]:
    """Every listed mutant of ``slugs`` (or the ``only`` names), each in its own copy; outcomes in order."""
    outcomes: list[Outcome] = []
    for slug in slugs:
        mutants = load(slug, root)
        if only is None and len(mutants) < MIN_MUTANTS:
            raise ValueError(f"{slug}: {len(mutants)} mutants; a paper lists at least {MIN_MUTANTS}")
        for m in mutants:
            if only is not None and m.name not in only:
                continue
            o = run_one(m, root=root, timeout=timeout)
            outcomes.append(o)
            if echo:
                print(f"{o.status:8s} {slug}:{m.name} ({o.seconds:.0f} s) {o.detail}", flush=True)
    return outcomes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("slugs", nargs="*", help="papers (tests/<slug>/mutants.toml)")
    parser.add_argument("--all", action="store_true", help="every paper with a mutants file")
    parser.add_argument("--only", action="append", help="run only the mutant(s) of this name")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per mutant (a hang counts as killed)")
    args = parser.parse_args(argv)
    slugs = papers_with_mutants() if args.all else args.slugs
    if not slugs:
        parser.error("name papers or pass --all")
    outcomes = check(slugs, only=set(args.only) if args.only else None, timeout=args.timeout)
    bad = [o for o in outcomes if o.status in ("survived", "stale")]
    print(f"{len(outcomes)} mutants: {sum(o.status in ('killed', 'timeout') for o in outcomes)} killed, "
          f"{sum(o.status == 'survived' for o in outcomes)} survived, {sum(o.status == 'stale' for o in outcomes)} stale")
    for o in bad:
        print(f"  {o.status.upper()}: {o.mutant.slug}:{o.mutant.name} — {o.mutant.why}", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
