"""Compare the numbers of two results of one paper, key by key: is a change a refactor?

A refactor regenerates identical numbers: every arm's per-seed values and unit values, every claim's estimate
(and, under the same verdict rules, its verdict). Timing fields, provenance and creation times are ignored.

Usage::

    python scripts/compare_results.py OLD.json NEW.json [--verdicts]

Exit status 0 when the numbers are identical (and, with ``--verdicts``, every claim's verdict), 1 otherwise;
each difference is printed as ``path: old -> new``.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

#: arm metrics that measure the machine, not the method
TIMING_WORDS = ("wall", "seconds", "time_s", "train_s", "build_s", "_s_per", "ms_per", "cpu_ms", "overhead_ms", "throughput",
                "elapsed", "time_ratio", "search_s")


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return a == b or (math.isnan(a) and math.isnan(b))
    return a == b


def _walk(a: Any, b: Any, path: str, out: list[str]) -> None:
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b)):
            if key not in a or key not in b:
                out.append(f"{path}.{key}: {'missing' if key not in a else 'present'} -> "
                           f"{'missing' if key not in b else 'present'}")
            else:
                _walk(a[key], b[key], f"{path}.{key}", out)
    elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _walk(x, y, f"{path}[{i}]", out)
    elif not _same(a, b):
        out.append(f"{path}: {a!r} -> {b!r}")


def differences(old: dict[str, Any], new: dict[str, Any], *, verdicts: bool = False) -> list[str]:
    """Every difference between the numbers of ``old`` and ``new`` (empty: a refactor)."""
    out: list[str] = []
    arms_old, arms_new = old.get("arms", {}), new.get("arms", {})
    for arm in sorted(set(arms_old) | set(arms_new)):
        metrics_old, metrics_new = arms_old.get(arm, {}), arms_new.get(arm, {})
        for metric in sorted(set(metrics_old) | set(metrics_new)):
            if any(word in metric for word in TIMING_WORDS):
                continue
            _walk(metrics_old.get(metric), metrics_new.get(metric), f"arms.{arm}.{metric}", out)
    _walk(old.get("seeds"), new.get("seeds"), "seeds", out)
    _walk(old.get("unit_ids"), new.get("unit_ids"), "unit_ids", out)
    claims_old = {c["id"]: c for c in old.get("claims", [])}
    claims_new = {c["id"]: c for c in new.get("claims", [])}
    for cid in sorted(set(claims_old) | set(claims_new)):
        a, b = claims_old.get(cid), claims_new.get(cid)
        if a is None or b is None:
            out.append(f"claims.{cid}: {'missing' if a is None else 'present'} -> {'missing' if b is None else 'present'}")
            continue
        _walk(a.get("estimate"), b.get("estimate"), f"claims.{cid}.estimate", out)
        if verdicts:
            _walk(a.get("verdict"), b.get("verdict"), f"claims.{cid}.verdict", out)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("old", type=Path)
    parser.add_argument("new", type=Path)
    parser.add_argument("--verdicts", action="store_true", help="also require every claim's verdict to agree")
    args = parser.parse_args(argv)
    old = json.loads(args.old.read_text(encoding="utf-8"))
    new = json.loads(args.new.read_text(encoding="utf-8"))
    diffs = differences(old, new, verdicts=args.verdicts)
    for line in diffs:
        print(line)
    n_claims = len(new.get("claims", []))
    print(f"{'identical' if not diffs else f'{len(diffs)} difference(s)'}: {args.old} vs {args.new} "
          f"({n_claims} claims)")
    return 1 if diffs else 0


if __name__ == "__main__":
    sys.exit(main())
