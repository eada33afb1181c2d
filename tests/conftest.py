"""Shared test set-up: offline hub switches, one thread, and a throw-away project root for report tests."""

from __future__ import annotations

import os

# Fail fast instead of retrying hub look-ups for ~30 s (the machine has no network but the registries).
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("ICML26_PROGRESS", "0")
os.environ.setdefault("FLWR_DISABLE_UPDATE_CHECK", "1")

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True, scope="session")
def _one_thread():
    """One torch thread for the whole session when torch is around (several times faster on 2 busy cores)."""
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a core dependency
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def task_identity():
    """(Flower tests) Flower builds messages from the running task's identity; set one for messages made outside a run."""
    from flwr.supercore.task_identity import TaskIdentity

    before = (TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id)
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 0
    yield
    TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id = before
