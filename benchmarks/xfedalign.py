"""xFedAlign: the per-round overhead of the explanation exchange against FedAvg, in time and bytes.

One round of every arm on the digits world (8 clients, Dirichlet non-IID, the reproduction's settings), run by
the in-process runner: FedAvg (local SGD + weighted average), xFedAlign (+ surrogate distillation, private
artifact, robust prior) and FedAttr-Agg (+ Captum IG maps of each client's data, dense upload). Rounds are
interleaved and the median wall time of ``--repeats`` rounds is reported; bytes are per client and round
(upload + download), from the runs' own accounting. One torch and BLAS thread.

Run: ``.venv/bin/python benchmarks/xfedalign.py`` (writes ``results/xfedalign/bench.json``).
"""

from __future__ import annotations

import argparse
import statistics
import time

from icml26.common.bench import bench_row, write_bench
from icml26.common.federation import run_in_process
from icml26.common.repro import set_threads
from icml26.xfedalign.baselines import FedAttrAgg
from icml26.xfedalign.core import FedTrain, XFedAlign
from icml26.xfedalign.data import load_task
from icml26.xfedalign.models import ModelSpec


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--out", default="results")
    args = parser.parse_args()
    set_threads(1)
    task = load_task("digits", "dirichlet", n_clients=8, seed=0)
    spec = ModelSpec(64, 10, 64)
    common = {"rounds": 1, "lr": 0.1, "local_epochs": 2, "batch_size": 16, "seed": 0}
    arms = {
        "FedAvg round": lambda: FedTrain(spec, **common),
        "xFedAlign round": lambda: XFedAlign(spec, task.groups, topk=8, noise_sigma=0.1, **common),
        "FedAttr-Agg round": lambda: FedAttrAgg(spec, task.groups, task.baseline, **common),
    }
    times: dict[str, list[float]] = {name: [] for name in arms}
    sizes: dict[str, float] = {}
    for make in arms.values():                                    # warm-up (imports, Captum)
        run_in_process(make(), task.clients)
    for _ in range(args.repeats):
        for name, make in arms.items():
            algo = make()
            t0 = time.perf_counter()
            out = run_in_process(algo, task.clients)
            times[name].append(time.perf_counter() - t0)
            b = out["bytes"][-1]
            sizes[name] = b["params_up"] + b["explain_up"] + b["download"]
    base_t = statistics.median(times["FedAvg round"]) * 1000
    rows = []
    for name in ("xFedAlign round", "FedAttr-Agg round"):
        rows.append(bench_row(f"{name}: wall time", "FedAvg round", statistics.median(times[name]) * 1000, base_t,
                              unit="ms", quantity="time", clients=8))
        rows.append(bench_row(f"{name}: bytes per client (up + down)", "FedAvg round", sizes[name],
                              sizes["FedAvg round"], unit="B", quantity="bytes", clients=8))
    for row in rows:
        print(f"{row['name']:48s} {row['method_value']:10.1f} {row['unit']:3s} vs {row['baseline_value']:10.1f}  "
              f"ratio {row['ratio']:.3f}")
    path = write_bench("xfedalign", rows, out_dir=args.out,
                       conditions=(f"digits, 8 clients, Dirichlet(0.3), MLP 64-64-10, 2 local epochs, one round, "
                                   f"median of {args.repeats}; one torch/BLAS thread"))
    print(path)


if __name__ == "__main__":
    main()
