"""The float-networks reproduction: baselines, smoke run through the CLI, determinism; quick run (slow)."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from icml26.float_networks.baselines import SobolevMLP, hermite_relu_network
from icml26.float_networks.experiment import PRESETS, run, targets

from ..conftest import ROOT
from ..helpers import reproduce_in_subprocess

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

    vals, _ = targets(400, 1, torch.float16, np.random.default_rng(0), hard_share=0.3)
    assert torch.equal(vals.to(torch.float16).double(), vals)
    assert (vals.abs() > 1000).any() and ((vals != 0) & (vals.abs() < 1e-4)).any() and (vals == 0).any()


def test_smoke_run_through_the_cli(tmp_path):
    data = reproduce_in_subprocess("float_networks", tmp_path, mode="smoke")
    holds = {c["id"]: c["holds"] for c in data["claims"]}
    assert holds["relu_exact"] and holds["values_exact"] and holds["phi_reachable_exact"]
    assert (tmp_path / "float_networks" / "smoke_exact_gradients.png").is_file()


def test_same_seed_same_numbers():
    def numbers(cfg):
        return {a: {k: v for k, v in m.items() if k != "build_s"} for a, m in run(cfg).metrics.items()}

    assert numbers(TINY) == numbers(TINY)


def test_bad_config():
    with pytest.raises(ValueError, match="activations"):
        run(dataclasses.replace(TINY, activations=("softsign",)))


@pytest.mark.slow
def test_quick_reproduces_the_committed_conclusions(tmp_path):
    data = reproduce_in_subprocess("float_networks", tmp_path, mode="quick")
    committed = json.loads((ROOT / "results" / "float_networks" / "quick.json").read_text())
    assert {c["id"]: c["holds"] for c in data["claims"]} == {c["id"]: c["holds"] for c in committed["claims"]}
