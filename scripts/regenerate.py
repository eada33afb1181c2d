"""Regenerate committed results from a clean commit: ``icml26 reproduce`` in a detached worktree of HEAD.

Results must come from a clean tree (``icml26 report --check`` refuses others). This script adds a detached
worktree of HEAD under the temp directory (uncommitted edits in this checkout are not in it: it warns), runs each
``SLUG:MODE`` there with ``PYTHONPATH`` pointing at the worktree's ``src`` (so the result records HEAD and hashes
the committed files), up to ``--jobs`` at a time with one torch thread each, and copies each finished result
(JSON and plots) back into this checkout's ``results/``. Logs go to ``<tmp>/icml26-regen/SLUG-MODE.log``.

Run (then ``icml26 report`` and commit the results)::

    .venv/bin/python scripts/regenerate.py fedit:quick fedit:full gcpa --jobs 2

A bare ``SLUG`` means both modes. Before anything runs, the mutation check (``scripts/mutants.py``) plants each
named paper's listed bugs and requires its fast tests to kill every one; a survivor stops the regeneration
(``--no-mutants`` skips the check, for a rerun of a paper whose check has just passed).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _git(*args: str, cwd: Path = ROOT) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("targets", nargs="+", help="SLUG or SLUG:MODE (quick, full or smoke)")
    parser.add_argument("--jobs", type=int, default=2, help="runs at a time (default 2, the machine's cores)")
    parser.add_argument("--no-mutants", action="store_true", help="skip the mutation check of the named papers")
    args = parser.parse_args(argv)
    if args.jobs < 1:
        parser.error("--jobs must be >= 1")
    dirty = _git("status", "--porcelain", "--", "src", "pyproject.toml")
    if dirty:
        print(f"warning: these uncommitted changes are NOT in the run (it reproduces HEAD):\n{dirty}", file=sys.stderr)
    jobs = []
    for t in args.targets:
        slug, _, mode = t.partition(":")
        for m in ([mode] if mode else ["quick", "full"]):
            if m not in ("smoke", "quick", "full"):
                parser.error(f"unknown mode {m!r} in {t!r}")
            jobs.append((slug, m))
    sha = _git("rev-parse", "HEAD")
    base = Path(tempfile.gettempdir()) / "icml26-regen"
    base.mkdir(exist_ok=True)
    tree = base / f"wt-{sha[:12]}"
    if not tree.exists():
        _git("worktree", "add", "--detach", str(tree), sha)
    if not args.no_mutants:  # the committed tests against the committed sources
        slugs = list(dict.fromkeys(slug for slug, _ in jobs))
        print(f"mutation check of {' '.join(slugs)} at {sha[:10]} (scripts/mutants.py)", flush=True)
        check = subprocess.run([sys.executable, str(tree / "scripts" / "mutants.py"), *slugs], cwd=tree)
        if check.returncode != 0:
            print("the mutation check failed: a paper's fast tests miss a listed bug (or a mutant is stale); "
                  "fix that first, or pass --no-mutants", file=sys.stderr)
            return 1
    env = {**os.environ, "PYTHONPATH": str(tree / "src"), "OMP_NUM_THREADS": "1", "ICML26_PROGRESS": "0",
           "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    running: list[tuple[str, str, subprocess.Popen, float]] = []
    failed = []
    while jobs or running:
        while jobs and len(running) < args.jobs:
            slug, mode = jobs.pop(0)
            with open(base / f"{slug}-{mode}.log", "w") as log:  # the child keeps its own copy of the handle
                proc = subprocess.Popen([sys.executable, "-m", "icml26", "reproduce", slug, "--mode", mode,
                                         "--out", str(tree / "results"), "--force"],
                                        cwd=tree, env=env, stdout=log, stderr=subprocess.STDOUT)
            running.append((slug, mode, proc, time.time()))
            print(f"started {slug} {mode} at {sha[:10]}", flush=True)
        time.sleep(2)
        for item in list(running):
            slug, mode, proc, t0 = item
            if proc.poll() is None:
                continue
            running.remove(item)
            if proc.returncode != 0:
                failed.append(f"{slug}:{mode}")
                print(f"FAILED {slug} {mode} (rc {proc.returncode}); see {base / f'{slug}-{mode}.log'}", flush=True)
                continue
            src, dst = tree / "results" / slug, ROOT / "results" / slug
            dst.mkdir(parents=True, exist_ok=True)
            for f in src.glob(f"{mode}*"):
                if f.suffix in (".json", ".png") and ".partial" not in f.name:
                    shutil.copy2(f, dst / f.name)
            print(f"done {slug} {mode} in {time.time() - t0:.0f} s", flush=True)
    if failed:
        print(f"failed: {' '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
