"""FedIT: time of the gamma-null test (exact kernels and random features) against the permutation test.

Both nulls are valid (the permutation null exactly, the gamma null approximately; see the level table in the
README). K = 5 clients of n rows each, shared-shifts data; each arm is timed over ``--rounds`` fits,
interleaved, median reported, one BLAS thread. Run: ``.venv/bin/python benchmarks/fedit.py``.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
from threadpoolctl import threadpool_limits

from icml26.fedit import FederatedIndependenceTest
from icml26.fedit.data import shared_shifts


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    threadpool_limits(1)
    print(f"K = 5 clients, one BLAS thread, median of {args.rounds} fits\n")
    print("| n per client | test | fit (s) | vs permutation B = 500 |")
    print("|---|---|---|---|")
    for n in (80, 1000):
        clients = shared_shifts(np.random.default_rng(0), n=n, dep=0.3)
        arms = {
            "gamma null, exact kernels": FederatedIndependenceTest(),
            "gamma null, 64 random features": FederatedIndependenceTest(random_features=64),
            "permutation null, B = 500": FederatedIndependenceTest(null="permutation", n_permutations=500),
        }
        times: dict[str, list[float]] = {name: [] for name in arms}
        for _ in range(args.rounds):
            for name, test in arms.items():
                t0 = time.perf_counter()
                test.fit(clients)
                times[name].append(time.perf_counter() - t0)
        base = statistics.median(times["permutation null, B = 500"])
        for name, ts in times.items():
            med = statistics.median(ts)
            print(f"| {n} | {name} | {med:.4f} | {med / base:.3f}x |")


if __name__ == "__main__":
    main()
