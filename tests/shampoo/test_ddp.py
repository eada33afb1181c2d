"""Shampoo under torch.distributed data parallel: 2 CPU processes, gloo backend."""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from icml26.shampoo import Shampoo

STEPS = 6


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))


def _data() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.randn(32, 6, generator=g), torch.randn(32, 3, generator=g)


def _opt(params) -> Shampoo:
    return Shampoo(params, lr=1e-2, precondition_frequency=2, start_preconditioning_step=2)


def _worker(rank: int, world: int, init_file: str, out_dir: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        model = torch.nn.parallel.DistributedDataParallel(_model())
        opt = _opt(model.parameters())
        x, y = _data()
        shard = slice(rank * 16, (rank + 1) * 16)
        for _ in range(STEPS):
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x[shard]), y[shard]).backward()
            opt.step()
        torch.save([p.detach() for p in model.module.parameters()], f"{out_dir}/rank{rank}.pt")
        # both ranks done before either tears gloo down (a rank exiting mid-teardown aborted once in a full run)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def test_ddp_two_processes_identical_and_equal_to_full_batch(tmp_path):
    mp.spawn(_worker, args=(2, str(tmp_path / "init"), str(tmp_path)), nprocs=2, join=True)
    r0 = torch.load(tmp_path / "rank0.pt", weights_only=True)
    r1 = torch.load(tmp_path / "rank1.pt", weights_only=True)
    for a, b in zip(r0, r1, strict=True):
        assert torch.equal(a, b), "ranks diverged"
    model = _model()
    opt = _opt(model.parameters())
    x, y = _data()
    for _ in range(STEPS):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    for a, p in zip(r0, model.parameters(), strict=True):
        torch.testing.assert_close(a, p.detach(), rtol=0, atol=1e-5)
