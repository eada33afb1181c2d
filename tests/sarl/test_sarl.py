"""SARL: airspace kinematics and separation, CPA against brute force, the shield, PERG/SC-MoE properties,
the streams world, GAE against TorchRL and a float64 reference, MAPPO, the PettingZoo API test (and TorchRL's
wrapper), the reproduction."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest
import torch

from icml26.sarl import (
    AirspaceCore,
    KinematicSafetyShield,
    KNNMLPPolicy,
    SARLPolicy,
    SCMoEHead,
    cpa,
    physics_prior,
)
from icml26.sarl.experiment import PRESETS, max_steps, run
from icml26.sarl.mappo import (
    PPOConfig,
    evaluate,
    evaluate_episodes,
    fly_straight,
    gae_advantages,
    greedy_direct,
    train,
)

from ..conftest import ROOT
from ..helpers import assert_matches_committed, reproduce_in_subprocess

#: the smoke preset's code path on a small world (the streams family with 4-8 aircraft), to keep tests fast
SMALL = dataclasses.replace(PRESETS["smoke"], train_sizes=(4, 6), eval_n=6, scales=(8,), radius_nm=30.0)


def _two(core, p1, h1, p2, h2, spd=420.0):
    """Place two aircraft by hand in env 0 (exits far ahead)."""
    core.alive[:] = False
    core.present[:] = False
    for i, (p, h) in enumerate(((p1, h1), (p2, h2))):
        core.present[0, i] = core.alive[0, i] = True
        core.x[0, i], core.y[0, i] = p
        core.hdg[0, i] = core.cmd_hdg[0, i] = h
        core.spd[0, i] = core.cmd_spd[0, i] = core.nominal[0, i] = spd
        core.exit_x[0, i] = p[0] + 200 * np.sin(np.radians(h))
        core.exit_y[0, i] = p[1] + 200 * np.cos(np.radians(h))
    core.pair_los[:] = False
    core.los_events[:] = 0
    core.los_time[:] = 0


def test_kinematics_by_hand():
    core = AirspaceCore(n_envs=1, n_aircraft=2, seed=0, max_steps=100)
    _two(core, (0.0, 0.0), 90.0, (0.0, 100.0), 90.0, spd=360.0)
    core.step(np.zeros((1, 2), int))
    # 360 kt for 15 s = 1.5 NM east, heading clockwise from north
    assert core.x[0, 0] == pytest.approx(1.5) and core.y[0, 0] == pytest.approx(0.0, abs=1e-9)
    core.step(np.array([[4, 0]]))  # right 30: rate one, 3 deg/s over 15 s reaches 135 deg? no: 30
    assert core.cmd_hdg[0, 0] == pytest.approx(120.0) and core.hdg[0, 0] == pytest.approx(120.0)
    core.step(np.array([[6, 0]]))  # speed + 20 kt at 1 kt/s: 15 kt in one decision
    assert core.cmd_spd[0, 0] == pytest.approx(380.0) and core.spd[0, 0] == pytest.approx(375.0)


def test_loss_of_separation_events_and_time():
    core = AirspaceCore(n_envs=1, n_aircraft=2, seed=0, max_steps=100)
    _two(core, (0.0, 0.0), 90.0, (20.0, 0.0), 270.0)  # head-on, closing at 840 kt
    for _ in range(8):
        core.step(np.zeros((1, 2), int))
    assert core.los_events[0] == 1.0  # one rising edge for the pair
    assert core.los_time[0].min() > 0 and core.los_time[0].max() % 5 == 0


def test_cpa_against_brute_force():
    rng = np.random.default_rng(0)
    p = rng.normal(0, 20, (200, 2))
    w = rng.normal(0, 400, (200, 2))
    t, d = cpa(p, w, 180.0)
    grid = np.linspace(0, 180, 18001)
    traj = p[:, None] + w[:, None] / 3600.0 * grid[None, :, None]
    dist = np.linalg.norm(traj, axis=-1)
    np.testing.assert_allclose(d, dist.min(1), atol=1e-3)
    np.testing.assert_allclose(t, grid[dist.argmin(1)], atol=0.02)


def test_shield_turns_right_in_a_head_on_encounter():
    core = AirspaceCore(n_envs=1, n_aircraft=2, seed=0)
    _two(core, (0.0, 0.0), 90.0, (25.0, 0.0), 270.0)
    shield = KinematicSafetyShield(core)
    sev, count = shield.severity()
    assert sev[0, 0, 0] > 0 and count[0, 0, 0] == 1  # maintaining is a conflict
    actions, overridden = shield.filter(np.zeros((1, 2), int))
    assert overridden.all() and set(actions[0]) <= {2, 4}  # both turn right (SERA), never left
    assert shield.safe_mask()[0, 0, 4] and not shield.safe_mask()[0, 0, 0]
    with pytest.raises(ValueError, match="mode"):
        KinematicSafetyShield(core, mode="vibes")


def test_physics_prior_and_perg_invariances():
    e = torch.zeros(11)
    e[4], e[6], e[9] = 0.5, 1.0, np.exp(-1.0)
    assert float(physics_prior(e)) == pytest.approx(-0.5 + np.exp(-1.0) - 0.5)
    torch.manual_seed(0)
    pol = SARLPolicy(moe=False).eval()
    core = AirspaceCore(n_envs=1, n_aircraft=6, seed=3)
    from icml26.sarl.mappo import forward, observe

    obs = observe(core, "graph")
    logits = forward(pol, "graph", obs)[0]
    perm = torch.tensor([3, 0, 5, 1, 4, 2])
    pobs = {
        "x": obs["x"][:, perm],
        "e": obs["e"][:, perm][:, :, perm],
        "mask": obs["mask"][:, perm][:, :, perm],
        "alive": obs["alive"][:, perm],
        "ctx": obs["ctx"][:, perm],
    }
    plogits = forward(pol, "graph", pobs)[0]
    torch.testing.assert_close(plogits, logits[:, perm], atol=1e-5, rtol=1e-5)  # permutation-equivariant
    big = AirspaceCore(n_envs=1, n_aircraft=20, radius_nm=60, seed=3)
    assert forward(pol, "graph", observe(big, "graph"))[0].shape == (1, 20, 8)  # any number of aircraft


def test_moe_gates_and_load_balance():
    head = SCMoEHead(d=16, n_experts=4, top_k=1, router_noise=0.0)
    z, ctx = torch.randn(3, 5, 16), torch.randn(3, 5, 2)
    with torch.no_grad():
        logits, aux, probs = head(z, ctx, torch.ones(3, 5, dtype=torch.bool))
    assert logits.shape == (3, 5, 8) and torch.allclose(probs.sum(-1), torch.ones(3, 5))
    f = torch.nn.functional.one_hot(probs.argmax(-1), 4).float().reshape(-1, 4).mean(0)
    p = probs.reshape(-1, 4).mean(0)
    assert float(aux.detach()) == pytest.approx(float(4 * (f * p).sum()), rel=1e-5)  # Switch: E sum f_e P_e
    with pytest.raises(ValueError, match="top_k"):
        SCMoEHead(n_experts=2, top_k=3)


def test_mappo_trains_and_references_behave():
    make = lambda: AirspaceCore(n_envs=4, n_aircraft=[3, 4], seed=0)  # noqa: E731
    hist = train(
        SARLPolicy(),
        "graph",
        make,
        PPOConfig(n_envs=4, rollout=8, epochs=1, minibatches=2),
        total_agent_steps=100,
        seed=0,
        shield_train=True,
    )
    assert hist and hist[-1]["agent_steps"] >= 100 and np.isfinite(hist[-1]["policy"])
    hist2 = train(
        KNNMLPPolicy(),
        "knn",
        make,
        PPOConfig(n_envs=4, rollout=8, epochs=1, minibatches=1),
        total_agent_steps=60,
        seed=0,
    )
    assert hist2[-1]["agent_steps"] >= 60
    straight = evaluate(
        fly_straight,
        lambda: AirspaceCore(n_envs=8, n_aircraft=5, scenario="circle", seed=1),
        episodes=8,
        shield_eval=False,
    )
    greedy = evaluate(
        greedy_direct,
        lambda: AirspaceCore(n_envs=8, n_aircraft=5, scenario="circle", seed=1),
        episodes=8,
        shield_eval=True,
    )
    assert straight["los_events"] > 1 and greedy["success"] > straight["success"]
    with pytest.raises(ValueError, match="kind"):
        train(KNNMLPPolicy(), "cnn", make, PPOConfig(), total_agent_steps=1)


def test_pettingzoo_api():
    pytest.importorskip("pettingzoo")
    from pettingzoo.test import parallel_api_test

    from icml26.sarl import parallel_env

    parallel_api_test(parallel_env(n_aircraft=5, seed=0), num_cycles=200)
    env = parallel_env(n_aircraft=4, max_aircraft=6, shield=True, seed=2)
    obs, _ = env.reset()
    assert len(env.agents) == 4 and obs["aircraft_0"]["nbr"].shape == (5, 11)
    assert obs["aircraft_0"]["action_mask"].sum() >= 1
    with pytest.raises(ValueError, match="invalid action"):
        env.step({"aircraft_0": 9})


def test_bad_input():
    with pytest.raises(ValueError, match="n_aircraft"):
        AirspaceCore(n_aircraft=0)
    with pytest.raises(ValueError, match="scenario"):
        AirspaceCore(scenario="spiral")
    for kwargs, match in (
        ({"n_envs": 0}, "n_envs"),
        ({"max_steps": 0}, "max_steps"),
        ({"substeps": 1.5}, "substeps"),
        ({"dt": float("nan")}, "dt"),
        ({"sep_nm": -1.0}, "sep_nm"),
        ({"lookahead_s": float("inf")}, "lookahead_s"),
        ({"radius_nm": 8.0}, "radius_nm"),
    ):
        with pytest.raises(ValueError, match=match):
            AirspaceCore(**kwargs)
    core = AirspaceCore(n_envs=2, n_aircraft=3, seed=0)
    with pytest.raises(ValueError, match="actions must be ints"):
        core.step(np.full((2, 3), 8))


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"n_aircraft": 0}, "n_aircraft must be a positive int"),
        ({"n_aircraft": -2}, "n_aircraft must be a positive int"),
        ({"n_aircraft": 2.5}, "n_aircraft must be a positive int"),
        ({"n_aircraft": True}, "n_aircraft must be a positive int"),
        ({"n_aircraft": []}, "n_aircraft must be a positive int"),
        ({"n_aircraft": 5, "max_aircraft": 3}, r"max_aircraft must be an int >= n_aircraft \(5\)"),
        ({"n_aircraft": [2, 6], "max_aircraft": 4}, r"max_aircraft must be an int >= n_aircraft \(6\)"),
        ({"seed": -1}, "seed must be a non-negative int"),
        ({"shield": "yes"}, "shield must be True or False"),
        ({"render_mode": "human"}, "render_mode"),
        ({"scenario": "spiral"}, "scenario"),
        ({"radius_nm": 0.0}, "radius_nm"),
        ({"max_steps": -1}, "max_steps"),
    ],
)
def test_parallel_env_bad_configuration_names_the_argument(kwargs, match):
    pytest.importorskip("pettingzoo")
    from icml26.sarl import parallel_env

    with pytest.raises((ValueError, TypeError), match=match):
        parallel_env(**kwargs)


def test_smoke_run_through_the_cli(tmp_path):
    data = reproduce_in_subprocess("sarl", tmp_path, mode="smoke")
    assert {"sarl", "sarl_no_moe", "mlp_knn_kss", "greedy_kss", "fly_straight", "sarl_no_shield_kss"} <= set(
        data["arms"]
    )
    assert {c["id"] for c in data["claims"]} >= {"not_only_the_shield", "beats_rule_based", "moe_stability"}
    assert (tmp_path / "sarl" / "smoke_sarl.png").is_file()
    assert (tmp_path / "sarl" / "smoke_sarl_curves.png").is_file()  # the learning curves (README)


def test_same_seed_same_numbers():
    cfg = dataclasses.replace(SMALL, budget=200, eval_episodes=2, eval_episodes_scales=1)
    a, b = run(cfg).metrics, run(cfg).metrics
    np.testing.assert_equal(a, b)  # NaN-aware


def test_seeded_evaluation_episodes_pair_across_policies():
    make = lambda: AirspaceCore(n_envs=3, n_aircraft=4, seed=99)  # noqa: E731  (core seed: irrelevant)
    seeds = [(7, i) for i in range(5)]  # 5 episodes in batches of 3 (one padded)
    starts = []

    def recording(act):
        def fn(core):
            if (core.t == 0).all() and core.alive.any():
                starts.append(np.stack([core.x, core.y], -1)[core.present].round(9).tolist())
            return act(core)

        return fn

    a = evaluate_episodes(recording(fly_straight), make, episode_seeds=seeds, shield_eval=False)
    b = evaluate_episodes(recording(greedy_direct), make, episode_seeds=seeds, shield_eval=True)
    assert len(a) == len(b) == 5 and starts[:2] == starts[2:]  # same scenarios, batch by batch
    assert [e["n"] for e in a] == [e["n"] for e in b] == [4.0] * 5
    # an episode depends on its own seed only: alone, or after others, it is the same scenario
    alone = evaluate_episodes(fly_straight, make, episode_seeds=seeds[3:4], shield_eval=False)
    np.testing.assert_equal(alone[0], a[3])  # NaN-aware (extra_path)
    assert evaluate(fly_straight, make, episodes=5, shield_eval=False, episode_seed=7)[
        "los_events"
    ] == pytest.approx(np.mean([e["los_events"] for e in a]))
    with pytest.raises(ValueError, match="one seed per reset env"):
        AirspaceCore(n_envs=2, n_aircraft=3, seed=0).reset(np.ones(2, bool), seeds=[1])


def test_run_records_paired_episode_units():
    cfg = dataclasses.replace(SMALL, budget=200, eval_episodes=3, eval_episodes_scales=2)
    res = run(cfg)
    assert set(res.units) == {"episodes", "episodes_n8"}
    for unit, n in (("episodes", 3), ("episodes_n8", 2)):
        suffix = unit.removeprefix("episodes")
        for arm, ms in res.units[unit].items():
            assert all(len(v) == n for v in ms.values()), (unit, arm)
            assert set(ms[f"success{suffix}"]) <= {0.0, 1.0}
            assert res.metrics[arm][f"ac_conflict_free{suffix}"] == pytest.approx(
                float(np.mean(ms[f"ac_conflict_free{suffix}"])), abs=1e-12
            )
    # a policy without the shield and the same policy shielded at inference fly the same scenarios
    assert (
        res.units["episodes"]["sarl_no_shield"].keys() == res.units["episodes"]["sarl_no_shield_kss"].keys()
    )
    assert "delay_s" in res.metrics["greedy_kss"]


def _gae_reference(rew, val, done, alive, last, gamma, lam):
    """Float64 GAE written from the definition: A_t = sum_k (gamma lam)^k delta_{t+k}, cut at episode ends."""
    rew, val, done, alive, last = (np.asarray(a, np.float64) for a in (rew, val, done, alive, last))
    T = rew.shape[0]
    nxt = np.concatenate([val[1:], last[None]], 0)
    delta = rew + gamma * nxt * (1 - done) - val
    adv = np.zeros_like(rew)
    for t in range(T):
        acc, disc = np.zeros_like(rew[0]), np.ones_like(rew[0])
        for k in range(t, T):
            acc = acc + disc * delta[k]
            disc = disc * gamma * lam * (1 - done[k])
        adv[t] = acc
    # an empty slot at t contributes nothing and passes nothing back (slot reuse after a reset)
    out = np.zeros_like(adv)
    acc = np.zeros_like(rew[0])
    for t in reversed(range(T)):
        acc = (delta[t] + gamma * lam * (1 - done[t]) * acc) * alive[t]
        out[t] = acc
    return adv, out


def test_gae_against_a_float64_reference_and_torchrl():
    g = torch.Generator().manual_seed(0)
    T, B, N = 12, 3, 4
    rew, val = torch.randn(T, B, N, generator=g), torch.randn(T, B, N, generator=g)
    last = torch.randn(B, N, generator=g)
    done = torch.rand(T, B, N, generator=g) < 0.2
    alive = torch.ones(T, B, N, dtype=torch.bool)
    ours = gae_advantages(rew, val, done, alive, last, 0.99, 0.95)
    closed_form, _ = _gae_reference(rew, val, done, alive, last, 0.99, 0.95)
    np.testing.assert_allclose(ours.numpy(), closed_form, rtol=1e-5, atol=1e-5)
    alive = torch.rand(T, B, N, generator=g) > 0.3  # empty slots mask the recursion
    _, masked = _gae_reference(rew, val, done, alive, last, 0.99, 0.95)
    np.testing.assert_allclose(
        gae_advantages(rew, val, done, alive, last, 0.99, 0.95).numpy(), masked, rtol=1e-5, atol=1e-5
    )
    tr = pytest.importorskip("torchrl.objectives.value.functional")
    # TorchRL: time on dim -2, a trailing feature dim; next values shifted by one step
    to_tr = lambda a: a.permute(1, 2, 0).unsqueeze(-1).double()  # noqa: E731  (T, B, N) -> (B, N, T, 1)
    nxt = torch.cat([val[1:], last[None]], 0)
    d_tr = done.permute(1, 2, 0).unsqueeze(-1)
    adv_tr, _ = tr.generalized_advantage_estimate(0.99, 0.95, to_tr(val), to_tr(nxt), to_tr(rew), d_tr, d_tr)
    ones = torch.ones(T, B, N, dtype=torch.bool)
    np.testing.assert_allclose(
        gae_advantages(rew.double(), val.double(), done, ones, last.double(), 0.99, 0.95).numpy(),
        adv_tr.squeeze(-1).permute(2, 0, 1).numpy(),
        rtol=1e-6,
        atol=1e-6,
    )  # TorchRL agrees to ~4e-8


def test_streams_world():
    core = AirspaceCore(
        n_envs=4, n_aircraft=20, radius_nm=40.0, max_steps=max_steps(20, 40.0), scenario="streams", seed=3
    )
    for b in range(4):
        n = int(core.present[b].sum())
        assert n == 20
        d = np.hypot(core.x[b, :n, None] - core.x[b, None, :n], core.y[b, :n, None] - core.y[b, None, :n])
        assert (d + np.eye(n) * 1e9).min() >= 2 * core.S  # no spawn conflicts
        exits = np.round(np.stack([core.exit_x[b, :n], core.exit_y[b, :n]], -1), 6)
        assert len(np.unique(exits, axis=0)) == 3  # flows 0 and 1 merge onto one fix
        assert np.allclose(np.hypot(*exits.T), 40.0)  # exits on the sector boundary
        # every aircraft starts on or outside the boundary, in trail behind its entry fix
        assert (np.hypot(core.x[b, :n], core.y[b, :n]) >= 40.0 - 1e-6).all()

    # the world the issue asks for: the shielded rule-based controller resolves some scenarios but not all,
    # fly-straight almost none, and the shield costs path and delay
    def make():
        return AirspaceCore(
            n_envs=6, n_aircraft=20, radius_nm=40.0, max_steps=max_steps(20, 40.0), scenario="streams", seed=0
        )

    straight = evaluate(fly_straight, make, episodes=6, shield_eval=False, episode_seed=5)
    greedy = evaluate(greedy_direct, make, episodes=6, shield_eval=True, episode_seed=5)
    assert straight["los_events"] > 5 and greedy["los_events"] < straight["los_events"]
    assert greedy["delay_s"] > straight["delay_s"] + 30 and straight["delay_s"] == pytest.approx(
        0.0, abs=10.0
    )


def test_delay_of_a_straight_flight_by_hand():
    core = AirspaceCore(n_envs=1, n_aircraft=2, seed=0, max_steps=200)
    _two(core, (0.0, 0.0), 90.0, (0.0, 50.0), 270.0)
    core.exit_x[0, 0], core.exit_y[0, 0] = 30.0, 0.0  # 28 NM to the capture circle at 420 kt
    core.exit_x[0, 1], core.exit_y[0, 1] = -30.0, 50.0
    core.straight[0, :2] = 28.0
    core.airborne_s[:] = 0.0
    core.auto_reset = False
    while core.alive[0].any():
        core.step(np.zeros((1, 2), int))
    m = core.episode_metrics(0)
    # 240 s at 420 kt; arrival is "closer than 2 NM", detected at the first 5 s substep past it: delay in [0, 5] s
    assert 0.0 <= m["delay_s"] <= 5.0 and m["success"] == 1.0


def test_torchrl_wraps_the_parallel_env():
    pytest.importorskip("pettingzoo")
    pytest.importorskip("torchrl")
    from torchrl.envs.libs.pettingzoo import PettingZooWrapper

    from icml26.sarl import parallel_env

    env = PettingZooWrapper(
        parallel_env(n_aircraft=4, shield=True, seed=0),
        use_mask=True,
        categorical_actions=True,
        return_state=False,
    )
    td = env.rollout(5)
    assert td.batch_size[0] == 5


@pytest.mark.slow
def test_quick_reproduces_the_committed_results(tmp_path):
    data = reproduce_in_subprocess("sarl", tmp_path, mode="quick")
    # The references (fly_straight, greedy_kss) are float64 numpy: identical on any CPU up to libm (1e-6). The
    # learned arms train with float32 torch: another CPU's BLAS changes the policies in the last bits, and PPO
    # amplifies that over 5k agent-samples per method; what must stay is every verdict and the scale of every number
    # (rates within 0.15, counts per aircraft or per episode within 30 %, delays within 30 % + 30 s).
    committed = json.loads((ROOT / "results" / "sarl" / "quick.json").read_text())
    metrics = {}
    for arm, ms in committed["arms"].items():
        for m, stat in ms.items():
            if arm in ("fly_straight", "greedy_kss"):
                metrics[f"{arm}.{m}"] = 1e-6
            elif m.startswith("delay_s"):
                metrics[f"{arm}.{m}"] = 0.3 * abs(stat["mean"]) + 30.0
            elif m.startswith(("success", "ac_conflict_free")):
                metrics[f"{arm}.{m}"] = 0.15
            else:
                metrics[f"{arm}.{m}"] = 0.3 * abs(stat["mean"]) + 0.1
    assert_matches_committed(data, atol=1e-6, metrics=metrics)


def _random_ppo_batch(kind, seed=0):
    """A random minibatch on a real airspace state: float64 policy, random shield masks, actions, old log-probs
    (perturbed so the ratio is clipped for some samples), advantages and returns, some empty slots."""
    g = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    pol = (SARLPolicy() if kind == "graph" else KNNMLPPolicy()).double()
    pol.eval()  # no router noise: the two evaluations see the same function
    from icml26.sarl.mappo import observe

    core = AirspaceCore(n_envs=3, n_aircraft=6, seed=seed)
    core.alive[0, -2:] = False  # two empty slots
    obs = {k: (v.double() if v.is_floating_point() else v) for k, v in observe(core, kind).items()}
    M, N = core.B, core.N
    amask = torch.rand(M, N, 8, generator=g) > 0.3
    amask[..., 0] = True
    live = torch.from_numpy(core.alive.copy())
    args = [obs["knn"]] if kind == "knn" else [obs[k] for k in ("x", "e", "mask", "alive", "ctx")]
    with torch.no_grad():
        logits = pol(*args)[0]
        dist = torch.distributions.Categorical(logits=logits.masked_fill(~amask, -1e9))
        act = dist.sample()
        old = dist.log_prob(act) + 0.3 * torch.randn(M, N, generator=g, dtype=torch.float64)
    adv = torch.randn(M, N, generator=g, dtype=torch.float64)
    ret = torch.randn(M, N, generator=g, dtype=torch.float64)
    return pol, args, obs, amask, act, old, adv, ret, live


@pytest.mark.parametrize("kind", ["graph", "knn"])
def test_torchrl_mappo_loss_and_gradient_equal_the_reference(kind):
    """The training loss goes through TorchRL's MAPPOLoss (a ClipPPOLoss); it and its gradient must equal the masked
    clipped objective written from the definition in float64 (sarl.reference), on random batches."""
    pytest.importorskip("torchrl")
    from icml26.sarl.reference import ppo_loss_reference
    from icml26.sarl.torchrl_loss import PPOLossTorchRL, pack_batch

    pol, args, obs, amask, act, old, adv, ret, live = _random_ppo_batch(kind)
    assert (~live).any()  # some empty slots, masked out of both
    loss = PPOLossTorchRL(pol, kind, clip=0.2, value_coef=0.5, entropy=0.01)
    pol.zero_grad()
    total, parts = loss(pack_batch(obs, amask, act, old, adv, ret), live)
    total.backward()
    grads = [p.grad.clone() for p in pol.parameters()]
    pol.zero_grad()
    logits, value, _ = pol(*args)
    ref = ppo_loss_reference(logits, value, amask, act, old, adv, ret, live, 0.2, 0.5, 0.01)
    ref.backward()
    # TorchRL clips log-ratios at float32 log(1 +- eps): agreement ~1e-9, not 1e-15
    assert float(total.detach()) == pytest.approx(float(ref.detach()), rel=1e-7, abs=1e-8)
    for gt, p in zip(grads, pol.parameters(), strict=True):
        np.testing.assert_allclose(gt.numpy(), p.grad.numpy(), rtol=1e-6, atol=1e-8)
    # the critic reused the actor's forward pass (one encoder pass per minibatch)
    assert loss.joint.misses == 0
    if kind == "graph":
        assert float(parts["aux"].detach()) > 0  # the MoE load-balancing loss comes out of the same pass


def test_torchrl_gae_equals_ours_with_empty_slots():
    pytest.importorskip("torchrl")
    from icml26.sarl.torchrl_loss import gae_torchrl

    g = torch.Generator().manual_seed(1)
    T, B, N = 12, 3, 4
    rew, val = torch.randn(T, B, N, generator=g), torch.randn(T, B, N, generator=g)
    last = torch.randn(B, N, generator=g)
    alive = torch.rand(T, B, N, generator=g) > 0.3
    # the core's invariant: a slot alive at t and empty at t + 1 ended (arrived or the episode ended) at t
    ends = alive & torch.cat([~alive[1:], torch.zeros(1, B, N, dtype=torch.bool)], 0)
    done = (torch.rand(T, B, N, generator=g) < 0.2) | ends
    adv, target = gae_torchrl(rew, val, done, alive, last, 0.99, 0.95)
    ours = gae_advantages(rew, val, done, alive, last, 0.99, 0.95)
    np.testing.assert_allclose(adv.numpy(), ours.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(target.numpy(), ((ours + val) * alive).numpy(), rtol=1e-5, atol=1e-6)


def test_training_through_torchrl_still_learns():
    """A short seeded run on a small crossing world: the greedy shielded policy's validation success rises above
    the untrained policy's on the same scenarios."""
    pytest.importorskip("torchrl")
    from icml26.sarl.mappo import greedy_policy

    make = lambda: AirspaceCore(n_envs=8, n_aircraft=[3, 4], seed=3)  # noqa: E731
    seeds = [(123, i) for i in range(16)]

    def success(pol):
        eps = evaluate_episodes(
            greedy_policy(pol, "knn", shield_mask=False),
            lambda: AirspaceCore(n_envs=16, n_aircraft=4, seed=5),
            episode_seeds=seeds,
            shield_eval=False,
        )
        return float(np.mean([e["success"] for e in eps]))

    torch.manual_seed(0)
    pol = KNNMLPPolicy()
    before = success(pol)
    hist = train(pol, "knn", make, PPOConfig(n_envs=8, rollout=16, lr=1e-3), total_agent_steps=6_000, seed=0)
    after = success(pol)
    assert after >= before + 0.25, (before, after, [h["reward"] for h in hist])


def test_planner_copies_are_exact_and_choices_valid():
    """The ceiling candidate's scenario copies evolve exactly as the original under the same instructions, and its
    instructions are valid and in the shield's safe set whenever it departs from greedy_kss."""
    from icml26.sarl.lab.planner import LookaheadPlanner, greedy_kss_actions, replicate

    core = AirspaceCore(n_envs=2, n_aircraft=8, seed=4, scenario="streams", radius_nm=30.0, max_steps=60)
    for _ in range(5):
        core.step(greedy_kss_actions(core))
    sim = replicate(core, 3)
    a = greedy_kss_actions(core)
    r0 = core.step(a)[0]
    r1 = sim.step(np.repeat(a, 3, axis=0))[0]
    for c in range(3):
        np.testing.assert_array_equal(r1[c::3], r0)
        np.testing.assert_array_equal(sim.x[c::3], core.x)
    plan = LookaheadPlanner(horizon=2, max_agents=2)
    safe = KinematicSafetyShield(core).safe_mask()
    base = greedy_kss_actions(core)
    out = plan(core)
    assert out.shape == (2, core.N) and out.min() >= 0 and out.max() < 8
    moved = out != base
    assert np.take_along_axis(safe, out[..., None], -1)[..., 0][moved].all()
    with pytest.raises(ValueError, match="horizon"):
        LookaheadPlanner(horizon=0)
    with pytest.raises(ValueError, match="max_agents"):
        LookaheadPlanner(max_agents=1.5)


def test_units_carry_scenario_ids_disjoint_from_training_and_validation():
    """Every unit has one id per episode; the ids are the scenarios themselves (the same seed draws the same id,
    the evaluation core meets those scenarios), and no evaluation scenario is a training or validation one."""
    from icml26.sarl.experiment import VALIDATION_SEED, _core, scenario_ids

    cfg = dataclasses.replace(SMALL, budget=200, eval_episodes=3, eval_episodes_scales=2, seed=5)
    out = run(cfg)
    assert set(out.unit_ids) == set(out.units) == {"episodes", "episodes_n8"}
    for unit, ids in out.unit_ids.items():
        n_units = {len(v) for by_arm in out.units[unit].values() for v in by_arm.values()}
        assert n_units == {len(ids)} and len(set(ids)) == len(ids)
    assert set(out.held_out) == set(out.unit_ids)
    for unit, splits in out.held_out.items():
        # the curve's validation scenarios and, with the pilot's rates, the tuning's (the more of the two)
        assert len(splits["train"]) >= cfg.n_envs
        assert len(splits["validation"]) == max(cfg.curve_episodes, cfg.tune_episodes if cfg.arm_lr else 0)
        assert not set(out.unit_ids[unit]) & (set(splits["train"]) | set(splits["validation"]))
    assert out.overlap() == {u: {"train": 0, "validation": 0} for u in out.unit_ids}
    # the ids name what the evaluation core flies: spawn the same seeds in an evaluation-sized core
    seeds = [(50_000 + cfg.seed + cfg.eval_n, i) for i in range(cfg.eval_episodes)]
    core = _core(cfg.eval_n, 0, cfg.eval_episodes, cfg.radius_nm)()
    core.reset(np.ones(core.B, bool), seeds=seeds)
    assert core.scenario_ids == out.unit_ids["episodes"]
    # a validation scenario given as a test unit is caught
    val = scenario_ids(cfg.eval_n, [(VALIDATION_SEED + cfg.eval_n, 0)], cfg.radius_nm)
    assert val[0] in out.held_out["episodes"]["validation"]


def test_full_records_the_learning_curve_on_its_first_seed_and_quick_full_seeds_are_disjoint():
    from icml26.registry import get_paper

    modes = get_paper("sarl").modes
    assert PRESETS["full"].curve_seed == modes["full"].seeds[0]
    assert not set(modes["quick"].seeds) & set(modes["full"].seeds)


def _cpa_by_hand(px, wx, wy):
    """Closed-form CPA of relative position (px, 0) NM and relative velocity (wx, wy) kt: tCPA = -p.w / |w|^2 (s),
    dCPA = |p x w| / |w| (NM), valid when tCPA lies in [0, 180] s."""
    t = -px * wx * 3600.0 / (wx**2 + wy**2)
    d = abs(px * wy) / math.hypot(wx, wy)
    return t, d


def test_shield_severity_and_counts_by_hand():
    """Head-on at 22 NM, 420 kt each: the severity sum (S + margin - dCPA) / (tCPA + 10 s) and the violation count
    of every instruction of aircraft 0, from the closed-form CPA (S = 5 NM, margin 1 NM). Right 30 passes at
    5.69 NM: a violation only because of the margin."""
    core = AirspaceCore(n_envs=1, n_aircraft=2, seed=0)
    _two(core, (0.0, 0.0), 90.0, (22.0, 0.0), 270.0)
    sev, count = KinematicSafetyShield(core).severity()
    for action, turn in ((0, 0.0), (1, -15.0), (2, 15.0), (3, -30.0), (4, 30.0)):
        h = math.radians(90.0 + turn)
        t, d = _cpa_by_hand(22.0, -420.0 - 420.0 * math.sin(h), -420.0 * math.cos(h))  # v_j - v_i
        assert 0.0 <= t <= 180.0 and d < 6.0, action
        assert count[0, 0, action] == 1, action
        assert sev[0, 0, action] == pytest.approx((6.0 - d) / (t + 10.0), rel=1e-9), action
    h30 = math.radians(120.0)
    d30 = _cpa_by_hand(22.0, -420.0 - 420.0 * math.sin(h30), -420.0 * math.cos(h30))[1]
    assert 5.0 < d30 < 6.0
    assert sev[0, 0, 0] == pytest.approx(6.0 / (22.0 * 3600.0 / 840.0 + 10.0), rel=1e-9)  # dCPA 0 at 94.3 s
    # the safe set is the pair of 30-degree turns (least severe), and the filter turns right
    mask = KinematicSafetyShield(core).safe_mask()
    assert mask[0, 0].tolist() == [False, False, False, True, True, False, False, False]
    assert KinematicSafetyShield(core).filter(np.zeros((1, 2), int))[0][0, 0] == 4


def test_step_reward_by_hand():
    """One decision of two aircraft 50 NM apart on parallel tracks (no conflict): the reward is the drift penalty
    -0.05 |bearing to exit - heading| / 180 and -0.02 per issued and per changed instruction, computed from the
    positions after 15 s flown by hand (aircraft 1 slows 420 -> 405 kt at 1 kt/s)."""
    core = AirspaceCore(n_envs=1, n_aircraft=2, seed=0, max_steps=100)
    _two(core, (0.0, 0.0), 90.0, (0.0, 50.0), 90.0)
    core.exit_x[0, 0], core.exit_y[0, 0] = 40.0, 20.0  # exit left of the track
    core.exit_x[0, 1], core.exit_y[0, 1] = 40.0, 30.0  # exit right of the track
    reward = core.step(np.array([[0, 5]]))[0]  # aircraft 0 maintains, aircraft 1 slows down
    x0 = 15.0 * 420.0 / 3600.0
    x1 = 5.0 * (415.0 + 410.0 + 405.0) / 3600.0
    assert core.x[0, 0] == pytest.approx(x0) and core.x[0, 1] == pytest.approx(x1)
    drift0 = abs(math.degrees(math.atan2(40.0 - x0, 20.0)) - 90.0) / 180.0
    drift1 = abs(math.degrees(math.atan2(40.0 - x1, 30.0 - 50.0)) - 90.0) / 180.0
    assert reward[0, 0] == pytest.approx(-0.05 * drift0, rel=1e-5)
    assert reward[0, 1] == pytest.approx(-0.05 * drift1 - 0.04, rel=1e-5)


@pytest.mark.parametrize("kind", ["knn", "graph"])
def test_old_log_probs_are_stored_under_the_rollouts_shield_mask(kind, monkeypatch):
    """With ``shield_train`` the rollout samples under the shield's mask, so the stored old log-probs must be the
    masked distribution's: on the first minibatch (no update yet) the PPO ratio exp(log pi_mask(a) - old) is exactly
    1 on every slot (an empty slot keeps every action), recomputed from the minibatch's own observations and mask.
    The unmasked policy's log-probs differ on these batches (the shield removes actions carrying probability), so
    storing those fails here (issue #53)."""
    pytest.importorskip("torchrl")
    from icml26.sarl import mappo, torchrl_loss

    seen = []
    pack = torchrl_loss.pack_batch

    def recording(obs, amask, act, logp, adv, ret):
        if not seen:  # the first minibatch: the policy is still the rollout's
            was_training = pol.training
            pol.eval()  # no router noise: the rollout's function
            with torch.no_grad():
                logits = mappo.forward(pol, kind, obs)[0]
            pol.train(was_training)
            masked = torch.distributions.Categorical(logits=logits.masked_fill(~amask, -1e9)).log_prob(act)
            unmasked = torch.distributions.Categorical(logits=logits).log_prob(act)
            seen.append((masked, unmasked, logp, amask))
        return pack(obs, amask, act, logp, adv, ret)

    monkeypatch.setattr(torchrl_loss, "pack_batch", recording)
    torch.manual_seed(0)
    pol = KNNMLPPolicy() if kind == "knn" else SARLPolicy()
    make = lambda: AirspaceCore(n_envs=4, n_aircraft=6, scenario="circle", seed=1)  # noqa: E731
    cfg = PPOConfig(n_envs=4, rollout=8, epochs=1, minibatches=1)
    train(pol, kind, make, cfg, total_agent_steps=1, seed=0, shield_train=True)
    masked, unmasked, old, amask = seen[0]
    assert (~amask).any(-1).sum() >= 10  # the shield removed actions on many decisions
    assert float((masked - unmasked).max()) > 0.05  # the two hypotheses differ on this batch
    np.testing.assert_allclose(torch.exp(masked - old).numpy(), 1.0, atol=1e-5)
