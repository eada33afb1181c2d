"""FedIT: time of the gamma-null test (exact kernels and random features) against the permutation test.

Both nulls are valid (the permutation null exactly, the gamma null approximately; see the level table in the
README). K = 5 clients of n rows each, shared-shifts data; each arm is timed over ``--rounds`` fits,
interleaved, median reported, one BLAS thread. Writes ``results/fedit/bench.json`` (one row per gamma-null arm
and client size: its median fit time over the permutation test's, measured in the same run), which
``icml26 report`` renders into the README. Run: ``.venv/bin/python benchmarks/fedit.py``.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
from threadpoolctl import threadpool_limits

from icml26.common.bench import bench_row, write_bench
from icml26.fedit import FederatedIndependenceTest
from icml26.fedit.data import shared_shifts

BASELINE = "permutation null, B = 500"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", default="results", help="results root; the JSON goes to <out>/fedit/bench.json")
    args = parser.parse_args()
    threadpool_limits(1)
    print(f"K = 5 clients, one BLAS thread, median of {args.rounds} fits\n")
    print(f"| n per client | test | fit (s) | vs {BASELINE} |")
    print("|---|---|---|---|")
    rows = []
    for n in (80, 1000):
        clients = shared_shifts(np.random.default_rng(0), n=n, dep=0.3)
        arms = {
            "gamma null, exact kernels": FederatedIndependenceTest(),
            "gamma null, 64 random features": FederatedIndependenceTest(random_features=64),
            BASELINE: FederatedIndependenceTest(null="permutation", n_permutations=500),
        }
        times: dict[str, list[float]] = {name: [] for name in arms}
        for _ in range(args.rounds):
            for name, test in arms.items():
                t0 = time.perf_counter()
                test.fit(clients)
                times[name].append(time.perf_counter() - t0)
        base = statistics.median(times[BASELINE])
        for name, ts in times.items():
            med = statistics.median(ts)
            print(f"| {n} | {name} | {med:.4f} | {med / base:.3f}x |")
            if name != BASELINE:
                # 4 significant digits: the README table shows the values as stored
                rows.append(bench_row(name, BASELINE, float(f"{med:.4g}"), float(f"{base:.4g}"), unit="s",
                                      n_per_client=n))
    path = write_bench("fedit", rows, out_dir=args.out,
                       conditions=f"K = 5 clients of n rows (shared-shifts data, sine dependence 0.3), one BLAS "
                                  f"thread, median of {args.rounds} fits per arm, arms interleaved in one process")
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
