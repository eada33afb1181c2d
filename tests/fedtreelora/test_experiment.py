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
            assert len(body) == world.length and ((body.count(q) in client.positive) ^ (q in world.twist)) == bool(y)
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
    with pytest.raises(ValueError, match="lr_grid"):
        ex.run(dataclasses.replace(ex.PRESETS["smoke"], lr_grid=(1e-2,)))
    with pytest.raises(ValueError, match="ditto_lams"):
        ex.run(dataclasses.replace(ex.PRESETS["smoke"], ditto_lams=(1.0, 0.1)))
    with pytest.raises(ValueError, match="lr_extend"):
        ex.run(dataclasses.replace(ex.PRESETS["smoke"], lr_extend=-1))
    assert set(ex.BASELINES) <= set(ex.PRESETS["quick"].arms)            # the headline's comparator is complete


def test_smoke_reproduction(tmp_path):
    data = reproduce_in_subprocess("fedtreelora", tmp_path, mode="smoke")
    arms = data["arms"]
    for arm in ("fedtreelora", "fedavg_lora", "flat_cluster", "oracle_cluster", "base_zero_shot", "majority",
                "fedavg_ft", "ditto", "best_baseline"):
        assert arms[arm]["accuracy"]["unit"] == "items"
        assert len(arms[arm]["accuracy"]["unit_values"][0]) == 8 * 24          # 8 clients x 24 test items
    for arm in ("fedtreelora", "flat_cluster", "fedavg_ft", "local", "base_zero_shot"):
        assert arms[arm]["accuracy_unseen"]["unit"] == "items_unseen"
        assert len(arms[arm]["accuracy_unseen"]["unit_values"][0]) == 4 * 24   # 4 unseen clients x 24 items
    picked = [arms["best_baseline"][f"picked_{a}"]["mean"] for a in ("local", "fedavg_ft", "ditto", "fixed_depth",
                                                                      "fedsa_lora", "flat_cluster")]
    assert sum(picked) == 1.0
    # smoke's two-value grids are not extended: every choice is on an edge, recorded and noted on the headline
    assert arms["fedtreelora"]["lr_at_edge"]["mean"] == 1.0 and arms["ditto"]["lam_at_edge"]["mean"] == 1.0
    headline = next(c for c in data["claims"] if c["id"] == "vs_best_baseline")
    assert "on the edge of its grid after 0 extension(s)" in str(headline["notes"])
    assert "ditto lam" in str(headline["notes"])
    assert arms["local"]["bytes_per_round"]["mean"] == 0.0
    assert arms["fedsa_lora"]["bytes_per_round"]["mean"] < arms["fedavg_lora"]["bytes_per_round"]["mean"]
    assert arms["fedtreelora"]["trainable_params"]["mean"] == arms["fedavg_lora"]["trainable_params"]["mean"] + 8
    assert {c["id"] for c in data["claims"]} >= {"vs_best_baseline", "fedavg_learns", "unseen_vs_fedavg_ft",
                                                "vs_fedavg_lora", "depth_premise", "tree_top"}
    assert (tmp_path / "fedtreelora" / "smoke_sharing_depth.png").is_file()


@pytest.mark.slow
def test_quick_reproduction_matches_the_committed_result(tmp_path):
    data = reproduce_in_subprocess("fedtreelora", tmp_path, mode="quick", timeout=1200)
    # float32 training on a CPU: BLAS summation order can flip a few borderline test items between machines
    assert_matches_committed(data, atol=0.02, metrics={"fedtreelora.bytes_per_round": 0.0})


def test_item_ids_name_client_and_prompt_and_splits_are_disjoint():
    """Test items are disjoint from the client's training and validation items, also where the prompt space is
    so small that the draws collide (they are drawn again), and the ids are what the item is."""
    from icml26.common.tiny_lm import char_tokenizer

    tok = char_tokenizer()
    for world, sizes in ((World(), (64, 64, 200)), (World(letters="abc", length=4, per_rule=1), (40, 20, 40))):
        clients = make_clients(world, tok, n_train=sizes[0], n_val=sizes[1], n_test=sizes[2], seed=3)
        for c in clients:
            test, train, val = c.item_ids("test"), c.item_ids("train"), c.item_ids("val")
            assert len(test) == len(c.test[1]) and len(train) == len(c.train[1]) and len(val) == len(c.val[1])
            assert not set(test) & (set(train) | set(val)) and not set(val) & set(train)
            assert all(i.startswith(f"c{c.cid}/") for i in test)
            decoded = [tok.decode(row) for row in c.test[0]]
            assert [f"c{c.cid}/{d[:-1]}" for d in decoded] == test  # the prompt the model reads, without "="
    with pytest.raises(ValueError, match="too few distinct prompts"):
        make_clients(World(letters="abc", length=4, per_rule=1), tok, n_train=300, n_val=300, n_test=300, seed=0)


def test_run_records_item_ids_and_held_out_items():
    from icml26.fedtreelora.experiment import PRESETS, run

    cfg = dataclasses.replace(PRESETS["smoke"], arms=("fedavg_lora",), n_train=8, n_val=4, n_test=6, rounds=1,
                              local_steps=1, warmup_rounds=1)
    out = run(cfg)
    assert set(out.unit_ids) == set(out.units) == {"items", "items_unseen"}
    ids = out.unit_ids["items"]
    assert len(ids) == len(set(ids)) == 8 * 6
    assert {len(v) for by_arm in out.units["items"].values() for v in by_arm.values()} == {len(ids)}
    assert len(out.held_out["items"]["train"]) == 8 * 8 and len(out.held_out["items"]["validation"]) == 8 * 4
    unseen = out.unit_ids["items_unseen"]
    assert len(unseen) == 4 * 6 and all(i.split("/")[0] in ("c8", "c9", "c10", "c11") for i in unseen)
    assert len(out.held_out["items_unseen"]["train"]) == 4 * 8
    assert out.overlap() == {"items": {"train": 0, "validation": 0}, "items_unseen": {"train": 0, "validation": 0}}


def test_quick_and_full_seeds_are_disjoint():
    from icml26.registry import get_paper

    modes = get_paper("fedtreelora").modes
    assert not set(modes["quick"].seeds) & set(modes["full"].seeds)
