"""Shampoo's state through ``torch.distributed.checkpoint`` (DCP): save, reload into a fresh optimizer, resume.

One process on the gloo backend (what a CPU test can run). The optimizer keeps a full replica of its state on
every rank (no ZeRO-style sharding of factors or roots), so under DDP every rank saves the same state and DCP
deduplicates it; sharded (FSDP/DTensor) parameters are not supported (README, Deviations).
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from icml26.shampoo import Shampoo


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))


def _opt(model) -> Shampoo:
    # blocks of 4 so the state holds lists of factors and roots per parameter
    return Shampoo(model.parameters(), lr=1e-2, precondition_frequency=2, max_preconditioner_dim=4)


def _step(model, opt, x, y) -> None:
    opt.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    opt.step()


@pytest.fixture
def process_group(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'init'}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


@pytest.mark.parametrize("initialize", [True, False], ids=["initialize_state", "get_state_dict_inits"])
def test_dcp_save_and_reload_resumes_bit_for_bit(tmp_path, process_group, initialize):
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(32, 6, generator=g), torch.randn(32, 3, generator=g)
    model = _model()
    opt = _opt(model)
    for _ in range(5):
        _step(model, opt, x, y)
    msd, osd = get_state_dict(model, opt)
    dcp.save({"model": msd, "optim": osd}, checkpoint_id=str(tmp_path / "ckpt"))

    fresh = _model()
    with torch.no_grad():
        for p in fresh.parameters():
            p.zero_()
    opt2 = _opt(fresh)
    if initialize:
        opt2.initialize_state()  # DCP loads into existing tensors
    # (otherwise get_state_dict initialises an empty optimizer itself, by one zero-gradient step at lr 0)
    msd2, osd2 = get_state_dict(fresh, opt2)
    target = {"model": msd2, "optim": osd2}
    dcp.load(target, checkpoint_id=str(tmp_path / "ckpt"))
    set_state_dict(fresh, opt2, model_state_dict=target["model"], optim_state_dict=target["optim"])

    for p, q in zip(model.parameters(), fresh.parameters(), strict=True):
        a, b = opt.state[p], opt2.state[q]
        assert b["step"] == 5 and set(a) == set(b)
        for key in ("left", "right", "left_root", "right_root"):
            for ta, tb in zip(a.get(key, []), b.get(key, []), strict=True):
                assert torch.equal(ta, tb)
        assert a.get("root_ready") == b.get("root_ready")
    for _ in range(3):
        _step(model, opt, x, y)
        _step(fresh, opt2, x, y)
    for a, b in zip(model.parameters(), fresh.parameters(), strict=True):
        assert torch.equal(a, b)


def test_initialize_state_creates_what_a_step_would():
    model = _model()
    opt = _opt(model)
    opt.initialize_state()
    for p in model.parameters():
        st = opt.state[p]
        assert st["step"] == 0 and torch.equal(st["exp_avg"], torch.zeros_like(p))
        if p.ndim == 2:
            n_blocks = len(st["root_ready"])
            assert n_blocks == -(-p.shape[0] // 4) * -(-p.shape[1] // 4) and not any(st["root_ready"])
