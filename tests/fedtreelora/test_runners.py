"""The same FedTreeLoRA run two ways: the harness's in-process runner and the batched runner (Flower: test_flower)."""

from __future__ import annotations

import copy

import numpy as np
import pytest

from icml26.common.federation import run_in_process
from icml26.fedtreelora.baselines import FedSALoRA, FFALoRA
from icml26.fedtreelora.core import FedTreeLoRA, run_batched
from icml26.fedtreelora.data import World, make_clients

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def lab():
    from icml26.common.tiny_lm import char_tokenizer, tiny_causal_lm

    tok = char_tokenizer()
    base = tiny_causal_lm(len(tok), hidden=16, layers=2, heads=2, kv_heads=1, intermediate=32, max_positions=16,
                          seed=0)
    world = World(per_rule=1)
    clients = make_clients(world, tok, n_train=16, n_val=8, n_test=12, seed=0)
    return base, tok, world, clients


def _trainers(lab, n):
    from icml26.fedtreelora.client import BatchedLoRATrainer, LoRATrainer

    base, tok, _, _ = lab
    kw = dict(r=2, alpha=4, batch_size=8)
    return LoRATrainer(copy.deepcopy(base), tok, **kw), BatchedLoRATrainer(base, tok, n, **kw)


def test_batched_runner_matches_the_harness_runner(lab):
    clients = lab[3]
    single, batched = _trainers(lab, len(clients))
    for k, v in single.init_state().items():
        np.testing.assert_array_equal(batched.init_state()[k], v)
    algo = FedTreeLoRA(single, train_rounds=3, local_steps=3, lr=0.05, warmup_rounds=1, seed=4)
    a = run_in_process(algo, clients)
    b = run_batched(algo, clients, batched)
    assert a["log"]["cuts"] == b["log"]["cuts"]
    for c in range(len(clients)):
        np.testing.assert_array_equal(a["test"][c], b["test"][c])
        for k, v in a["messages"][c].items():
            np.testing.assert_allclose(b["messages"][c][k], v, atol=1e-5)   # float summation order only
    assert a["mix"] == pytest.approx(b["mix"], abs=1e-5)
    assert a["bytes_up"] == b["bytes_up"] and a["bytes_down"] == b["bytes_down"]


def test_trainable_factors_follow_the_baselines(lab):
    clients = lab[3]
    single, batched = _trainers(lab, len(clients))
    init = single.init_state()
    kw = dict(train_rounds=2, local_steps=2, lr=0.05)
    ffa = run_batched(FFALoRA(single, **kw), clients, batched)
    for k in init:                                              # FFA-LoRA: A is never sent (it stays at init)
        if "lora_A" in k:
            assert "clus/" + k not in ffa["messages"][0]
    fedsa = run_batched(FedSALoRA(single, **kw), clients, batched)
    assert all("lora_A" in k for k in fedsa["messages"][0])     # FedSA-LoRA: only A is shared
    with pytest.raises(ValueError, match="no training data"):
        single.train((np.zeros((0, 11), dtype=np.int64), np.zeros(0, dtype=np.int64)), init, None, None, steps=1,
                     lr=0.1, seed=(0,))
