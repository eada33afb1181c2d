"""GCPA / GPA / multi-view CCA: fit time against cca-zoo's generalised CCA, as ratios in one run.

M = 5 views, n = 10,000 paired rows, widths 64-128, k = 32 components; each arm is fitted ``--rounds`` times,
interleaved, median reported. Peer: ``cca_zoo.linear.GCCA`` and ``cca_zoo.linear.MCCA`` (cca-zoo 4.x, the
``opt`` extra). Writes ``results/gcpa/bench.json``: each of our estimators' median fit time over cca-zoo's GCCA
(and our SUMCOR over cca-zoo's MCCA, the same objective), measured in the same run; ``icml26 report`` renders it
into the README. Run: ``.venv/bin/python benchmarks/gcpa.py``.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch
from threadpoolctl import threadpool_limits

from icml26.common.bench import bench_row, write_bench
from icml26.gcpa import GCPA, GeneralizedProcrustes, MultiviewCCA

#: each of our arms and the peer it is compared with (the same objective where there is one)
BASELINES = {
    "icml26 GeneralizedProcrustes": "cca-zoo GCCA",
    "icml26 GCPA": "cca-zoo GCCA",
    "icml26 MultiviewCCA maxvar": "cca-zoo GCCA",
    "icml26 MultiviewCCA sumcor": "cca-zoo MCCA",
}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--n", type=int, default=10_000)
    parser.add_argument(
        "--out", default="results", help="results root; the JSON goes to <out>/gcpa/bench.json"
    )
    args = parser.parse_args()
    torch.set_num_threads(1)
    threadpool_limits(1)  # one BLAS thread for every arm
    rng = np.random.default_rng(0)
    Z = rng.normal(size=(args.n, 16))
    views = [
        Z @ rng.normal(size=(16, d)) + 0.5 * rng.normal(size=(args.n, d)) for d in (64, 80, 96, 112, 128)
    ]
    k = 32
    arms = {
        "icml26 GeneralizedProcrustes": lambda: GeneralizedProcrustes(k).fit(views),
        "icml26 GCPA": lambda: GCPA(k).fit(views),
        "icml26 MultiviewCCA maxvar": lambda: MultiviewCCA(k, method="maxvar").fit(views),
        "icml26 MultiviewCCA sumcor": lambda: MultiviewCCA(k, method="sumcor").fit(views),
    }
    try:
        from cca_zoo.linear import GCCA, MCCA

        arms["cca-zoo GCCA"] = lambda: GCCA(n_components=k, shrinkage=0.1).fit(views)
        arms["cca-zoo MCCA"] = lambda: MCCA(n_components=k, shrinkage=0.1).fit(views)
    except ImportError:
        print("cca-zoo is not installed (pip install 'icml26[bench]'): the peer is skipped")
    times: dict[str, list[float]] = {name: [] for name in arms}
    for _ in range(args.rounds):
        for name, fit in arms.items():
            t0 = time.perf_counter()
            fit()
            times[name].append(time.perf_counter() - t0)
    med = {name: statistics.median(ts) for name, ts in times.items()}
    peer = med.get("cca-zoo GCCA")
    print(
        f"M = 5, n = {args.n}, widths 64-128, k = {k}, one BLAS/torch thread, median of {args.rounds} fits\n"
    )
    print("| method | fit (s) | vs cca-zoo GCCA |")
    print("|---|---|---|")
    for name, value in med.items():
        print(f"| {name} | {value:.3f} | {value / peer:.2f}x |" if peer else f"| {name} | {value:.3f} | — |")
    if peer is None:
        print("\nno peer measured: results/gcpa/bench.json is not written")
        return
    # 4 significant digits: the README table shows the values as stored
    rows = [
        bench_row(name, base, float(f"{med[name]:.4g}"), float(f"{med[base]:.4g}"), unit="s")
        for name, base in BASELINES.items()
    ]
    path = write_bench(
        "gcpa",
        rows,
        out_dir=args.out,
        conditions=f"M = 5 views, n = {args.n} paired rows, widths 64-128, k = {k} components, "
        "CCA shrinkage 0.1; one BLAS and torch thread; median of "
        f"{args.rounds} fits per arm, arms interleaved in one process",
    )
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
