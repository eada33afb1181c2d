"""The float-networks reproduction: baselines, smoke run through the CLI, determinism; quick run (slow)."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch

from icml26.float_networks.baselines import SobolevMLP, hermite_relu_network
from icml26.float_networks.experiment import PRESETS, domain, run, targets

from ..helpers import assert_matches_committed, reproduce_in_subprocess

TINY = dataclasses.replace(PRESETS["smoke"], activations=("relu", "tanh"), n_float32=16, sobolev_steps=2)


def test_hermite_baseline_is_right_in_real_arithmetic():
    pts = torch.tensor([-0.75, -0.1, 0.3, 0.9], dtype=torch.float64)
    vals = torch.tensor([1.0, -2.0, 0.5, 4.0], dtype=torch.float64)
    slopes = torch.tensor([3.0, 0.0, -1.5, 2.0], dtype=torch.float64)
    net = hermite_relu_network(pts, vals, slopes, dtype=torch.float64)
    x = pts.clone().requires_grad_(True)
    y = net(x)
    y.sum().backward()
    torch.testing.assert_close(y.detach(), vals, atol=1e-12, rtol=0)
    torch.testing.assert_close(x.grad, slopes, atol=1e-9, rtol=0)


def test_sobolev_baseline_learns():
    pts = torch.linspace(-1, 1, 32, dtype=torch.float64)
    mlp = SobolevMLP(seed=0).fit(pts, torch.sin(3 * pts), 3 * torch.cos(3 * pts), steps=300)
    with torch.no_grad():
        assert float((mlp(pts.float()) - torch.sin(3 * pts).float()).abs().max()) < 0.2


def test_targets_are_representable_and_include_hard_cases():
    import numpy as np

    vals, grads = targets(400, 1, torch.float16, np.random.default_rng(0), hard_share=0.3)
    assert torch.equal(vals.to(torch.float16).double(), vals)
    assert (vals.abs() > 1000).any() and ((vals != 0) & (vals.abs() < 1e-4)).any() and (vals == 0).any()
    tiny = torch.finfo(torch.float16).tiny
    sub = grads[(grads != 0) & (grads.abs() < tiny)]
    assert (torch.frexp(sub)[0].abs() != 0.5).any()                  # a subnormal that is not a power of two
    assert (torch.signbit(grads) & (grads == 0)).any()                # -0 targets


def test_smoke_run_through_the_cli(tmp_path):
    data = reproduce_in_subprocess("float_networks", tmp_path, mode="smoke")
    claims = {c["id"]: c for c in data["claims"]}
    # every point hit, hard targets included; one seed's points cannot push the Clopper-Pearson bound to 0.999
    for cid in ("relu_exact", "tanh_exact", "sigmoid_exact", "gelu_exact", "registered_exact", "values_exact"):
        assert claims[cid]["estimate"] == 1.0 and claims[cid]["verdict"] != "fails", cid
        assert claims[cid]["test"].startswith("Clopper-Pearson")
    assert claims["phi_reachable_exact"]["kind"] == "evidence"
    arms = data["arms"]
    # the signed zeros are reported, not hidden: some -0 gradient targets come back +0
    assert arms["construct_relu"]["zero_sign_mismatch_frac"]["mean"] > 0
    assert claims["naive_inexact"]["verdict"] == "holds" and "Agresti-Min" in claims["naive_inexact"]["test"]
    assert (tmp_path / "float_networks" / "smoke_exact_gradients.png").is_file()
    # verdicts v3: every per-point metric carries ids (the 1-D smoke domains: the unit's ids); no held-out set
    for arm, metrics in arms.items():
        for name, stat in metrics.items():
            if "unit" in stat:
                key = f"{arm}.{name}" if f"{arm}.{name}" in data["unit_ids"] else stat["unit"]
                assert [len(s) for s in data["unit_ids"][key]] == [len(s) for s in stat["unit_values"]], key
    assert set(data["unit_ids"]) == {"points"} and data["overlap"] == {}


def test_per_point_outcomes_pair_and_average_to_the_fractions():
    out = run(TINY)
    per = out.units["points"]
    sizes = [len(domain(fmt, TINY.seed, TINY)) for fmt in ("float32", "float16", "bfloat16")]
    total = sum(sizes)
    for act in TINY.activations:
        assert len(per[f"construct_{act}"]["exact_grad"]) == total
        # format by format: each slice's mean is that format's exact fraction (unreachable targets count as missed)
        for fmt, lo, n in zip(("float32", "float16", "bfloat16"), np.cumsum([0, *sizes[:-1]]), sizes, strict=True):
            sl = per[f"construct_{act}"]["exact_grad"][lo:lo + n]
            assert float(np.mean(sl)) == pytest.approx(out.metrics[f"construct_{act}"][f"grad_{fmt}"], abs=1e-12)
    assert float(np.mean(per["construct_tanh"]["exact_grad"])) == 1.0   # hard targets too (per-point scaling)
    assert {len(v) for v in per["constructions"].values()} == {total}
    # the baselines pair with the ReLU construction point by point on the same 1-D domains
    assert (len(per["construct_relu"]["exact_value_1d"]) == len(per["sobolev"]["exact_value"])
            == len(per["naive"]["exact_grad"]) == total)


def test_same_seed_same_numbers():
    def numbers(cfg):
        return {a: {k: v for k, v in m.items() if k != "build_s"} for a, m in run(cfg).metrics.items()}

    assert numbers(TINY) == numbers(TINY)


def test_bad_config():
    with pytest.raises(ValueError, match="activations"):
        run(dataclasses.replace(TINY, activations=("softsign",)))
    with pytest.raises(ValueError, match="at least one of"):
        run(dataclasses.replace(TINY, activations=("softplus",)))


def quick_tolerances(arms: dict) -> dict[str, float]:
    """Per-metric absolute tolerances on another CPU, and why.

    The constructions rely on torch's CPU kernels (exact saturation, relu'(0) = 0, tanh/sigmoid backward from
    outputs); another CPU's vectorised kernel variant may saturate at another power of two. The construction
    scans for it, but hard targets near the format's limits can move between reachable and unreachable: exact
    and unreachable fractions within 0.01 (a dozen of a seed's 1256 points). What the constructions hit they
    hit exactly, so their ulp distances and non-finite counts stay 0. The baselines are a float32-trained MLP
    and an interpolant rounded into the format: their ulp distances depend on summation order (not compared)
    and the interpolant's overflow count may move by a few dozen of its ~2500. Build times are wall-clock.
    """
    tol = {}
    for arm, metrics in arms.items():
        construct = arm.startswith("construct") or arm == "constructions"
        for name in metrics:
            if name == "build_s":
                t = math.inf
            elif name.startswith("max_ulp"):
                t = 0.0 if construct else math.inf
            elif name == "nonfinite":
                t = 0.0 if construct else 50.0
            else:
                t = 0.01
            tol[f"{arm}.{name}"] = t
    return tol


@pytest.mark.slow
def test_quick_reproduces_the_committed_result(tmp_path):
    data = reproduce_in_subprocess("float_networks", tmp_path, mode="quick")
    assert_matches_committed(data, atol=0.01, metrics=quick_tolerances(data["arms"]))


def test_points_carry_ids_distinct_within_and_across_seeds():
    # verdicts v3: a unit is a point with its targets; the seed draws the targets, so ids never repeat across seeds.
    # On the 1-D domains every metric lists every point: the unit's ids cover them all
    a, b = run(TINY), run(dataclasses.replace(TINY, seed=1))
    ids = a.unit_ids["points"]
    assert set(a.unit_ids) == set(a.units) == {"points"}
    assert len(set(ids)) == len(ids)
    for metrics in a.units["points"].values():
        for values in metrics.values():
            assert len(values) == len(ids)
    assert not set(ids) & set(b.unit_ids["points"])
    assert a.held_out == {}                      # a construction is built on the points it is checked on


def test_point_ids_of_the_two_d_grids_cover_every_metric_and_the_paired_checks_pair():
    # with the 2-D grids (full) the 1-D-only metrics (the baselines' pairs) list fewer points: they carry the 1-D
    # points' ids ("arm.metric"), every other metric the unit's ids over all points
    from icml26.common.results import aggregate_arms, aggregate_ids
    from icml26.float_networks.experiment import ONE_D_METRICS, point_ids
    from icml26.registry import get_paper

    cfg = dataclasses.replace(TINY, two_d=True, activations=("relu", "softplus"))
    grid = domain("float16", 0, cfg, dim=2)
    ids = point_ids("float16", 2, grid, 0)
    assert len(set(ids)) == len(ids) == len(grid) and ids[1] == "s0:float16:2d:0.0,0.125"
    out = run(cfg)
    one_d = {k for k in out.unit_ids if k != "points"}
    assert one_d == set(ONE_D_METRICS) and len({tuple(out.unit_ids[k]) for k in one_d}) == 1
    assert all(":1d:" in u for u in out.unit_ids["naive.exact_grad"])
    assert set(out.unit_ids["naive.exact_grad"]) < set(out.unit_ids["points"])
    for arm, metrics in out.units["points"].items():
        for name, values in metrics.items():
            assert len(out.unit_ids.get(f"{arm}.{name}", out.unit_ids["points"])) == len(values), (arm, name)
    assert out.held_out == {}
    # the card's checks over points (those whose arms this run has) take their ids without a mismatch
    arms, (unit_ids, _) = aggregate_arms([out]), aggregate_ids([out])
    decided = 0
    for claim in get_paper("float_networks").claims_for("full"):
        if all(r.arm in arms for r in claim.check.refs):
            outcome = claim.check.evaluate(arms, unit_ids)
            assert outcome.verdict in ("holds", "inconclusive", "fails")
            decided += 1
    assert decided == 6  # relu, registered, constructions (2), and the two paired baseline checks


