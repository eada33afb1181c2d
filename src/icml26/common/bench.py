"""Benchmark results: ``results/<slug>/bench.json``, written by ``benchmarks/<slug>.py`` and rendered by the report.

A benchmark measures the method and its baseline (a peer library, or the paper's own baseline) in one run,
interleaved, and stores one row per comparison::

    {"slug", "command", "created", "env", "conditions",
     "rows": [{"name", "baseline", "ratio", "quantity", "method_value", "baseline_value", "unit", ...}]}

``ratio`` is the method's time (or memory, tokens, bytes: ``quantity``) over the baseline's, lower is better.
Any further keys of a row (e.g. ``"model": "transformer"``) become columns of the README table that
``icml26 report`` generates between ``<!-- icml26:bench:begin/end -->`` markers.

Example:
    >>> import tempfile, json
    >>> out = tempfile.mkdtemp()
    >>> row = bench_row("Shampoo step", "AdamW step", 12.0, 10.0, unit="ms")
    >>> row["ratio"]
    1.2
    >>> path = write_bench("demo", [row], conditions="toy", out_dir=out)
    >>> json.loads(path.read_text())["rows"][0]["name"]
    'Shampoo step'
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import os
import statistics
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from .io import atomic_write_text
from .repro import environment


def median_ms(fn: Callable[[], Any], rounds: int) -> float:
    """Median wall time of ``rounds`` calls of ``fn``, in milliseconds.

    Raises:
        ValueError: ``rounds`` is below 1.
    """
    if rounds < 1:
        raise ValueError(f"rounds must be at least 1, got {rounds}")
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times)


def bench_row(name: str, baseline: str, method_value: float, baseline_value: float, *, unit: str = "ms",
              quantity: str = "time", **extra: Any) -> dict[str, Any]:
    """One comparison: ``ratio = method_value / baseline_value`` (lower is better).

    Raises:
        ValueError: a value is not finite, or the baseline is not positive.
    """
    m, b = float(method_value), float(baseline_value)
    if not (math.isfinite(m) and math.isfinite(b)) or b <= 0 or m < 0:
        raise ValueError(f"bench_row {name!r}: need finite values, method >= 0 and baseline > 0; got {m}, {b}")
    return {"name": name, "baseline": baseline, "quantity": quantity, "method_value": m, "baseline_value": b,
            "unit": unit, "ratio": m / b, **extra}


def write_bench(slug: str, rows: Sequence[Mapping[str, Any]], *, conditions: str, out_dir: str | os.PathLike[str]
                = "results", command: str | None = None) -> Path:
    """Write ``<out_dir>/<slug>/bench.json`` atomically and return its path."""
    if not rows:
        raise ValueError("rows must be non-empty")
    for row in rows:
        if not {"name", "baseline", "ratio"} <= set(row):
            raise ValueError(f"every row needs name, baseline, ratio; got {sorted(row)}")
    data = {
        "slug": slug, "command": command or "python " + " ".join([Path(sys.argv[0]).as_posix(), *sys.argv[1:]]),
        "created": _dt.datetime.now(_dt.UTC).replace(microsecond=0).isoformat(),
        "env": environment(), "conditions": conditions, "rows": [dict(r) for r in rows],
    }
    path = Path(out_dir) / slug / "bench.json"
    atomic_write_text(path, json.dumps(data, indent=2, sort_keys=True) + "\n")
    return path
