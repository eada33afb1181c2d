"""The embedded world, the experiment's contract, the smoke run and (slow) the quick reproduction."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from icml26.fedtreelora.data import COUNTS, World, make_clients, pretrain_corpus, rule_set

from ..helpers import assert_matches_committed, reproduce_in_subprocess


def test_world_plants_the_hierarchy_and_balanced_labels():
    world = World()
    assert world.n_clients == 8
    assert [c.rule for c in world.clients] == ["0011", "0011", "0001", "0001", "0100", "0100", "0110", "0110"]
    rng = np.random.default_rng(0)
    for client in world.clients:
        strings, labels = world.sample(client, rng, 600)
        assert abs(labels.mean() - 0.5) < 0.06                         # balanced by construction
        for s, y in zip(strings[:50], labels[:50], strict=True):
            body, q = s.split(":")
            assert len(body) == world.length and (body.count(q) in client.positive) == bool(y)
    # siblings agree everywhere; cousins on all but one count; groups on at most two of four
    def disagree(a, b):
        return len(rule_set(a) ^ rule_set(b))
    assert disagree("0011", "0001") == 1 and disagree("0100", "0110") == 1
    assert min(disagree(a, b) for a in ("0011", "0001") for b in ("0100", "0110")) >= 2
    prompts, answers = pretrain_corpus(world.letters, world.length, rng, 200)
    assert all(p[:world.length].count(p[-2]) == int(a) for p, a in zip(prompts, answers, strict=True))
    assert set(answers) == {str(c) for c in COUNTS}


def test_world_rejects_bad_rules_and_splits():
    with pytest.raises(ValueError, match="labels every count the same"):
        rule_set("1111")
    with pytest.raises(ValueError, match="0/1"):
        rule_set(">=2")
    with pytest.raises(ValueError, match="distinct rules"):
        World(groups=(("0011",), ("0011",)))
    with pytest.raises(ValueError, match="letters"):
        World(letters="aab")

    class Tok:
        def __call__(self, s, add_special_tokens=False):
            return {"input_ids": [ord(ch) for ch in s]}

    with pytest.raises(ValueError, match="at least one example"):
        make_clients(World(), Tok(), n_train=0, n_val=1, n_test=1, seed=0)


def test_experiment_contract_and_bad_config():
    from icml26.fedtreelora import experiment as ex
    from icml26.runner import check_experiment_module

    check_experiment_module(ex, "fedtreelora")
    assert set(ex.PRESETS["quick"].arms) <= set(ex.ALL_ARMS)
    assert set(ex.PRESETS["full"].arms) == set(ex.ALL_ARMS)
    with pytest.raises(ValueError, match="unknown arms"):
        ex.run(dataclasses.replace(ex.PRESETS["smoke"], arms=("fedavg", )))
    with pytest.raises(ValueError, match="lr_grid"):
        ex.run(dataclasses.replace(ex.PRESETS["smoke"], lr_grid=(0.0,)))


def test_smoke_reproduction(tmp_path):
    data = reproduce_in_subprocess("fedtreelora", tmp_path, mode="smoke")
    arms = data["arms"]
    for arm in ("fedtreelora", "fedavg_lora", "flat_cluster", "oracle_cluster", "base_zero_shot", "majority"):
        assert arms[arm]["accuracy"]["unit"] == "items"
        assert len(arms[arm]["accuracy"]["unit_values"][0]) == 8 * 24          # 8 clients x 24 test items
    assert arms["local"]["bytes_per_round"]["mean"] == 0.0
    assert arms["fedsa_lora"]["bytes_per_round"]["mean"] < arms["fedavg_lora"]["bytes_per_round"]["mean"]
    assert arms["fedtreelora"]["trainable_params"]["mean"] == arms["fedavg_lora"]["trainable_params"]["mean"] + 8
    assert {c["id"] for c in data["claims"]} >= {"vs_fedavg_lora", "depth_premise", "tree_top"}
    assert (tmp_path / "fedtreelora" / "smoke_sharing_depth.png").is_file()


@pytest.mark.slow
def test_quick_reproduction_matches_the_committed_result(tmp_path):
    data = reproduce_in_subprocess("fedtreelora", tmp_path, mode="quick", timeout=1200)
    # float32 training on a CPU: BLAS summation order can flip a few borderline test items between machines
    assert_matches_committed(data, atol=0.02, metrics={"fedtreelora.bytes_per_round": 0.0})
