"""SARL's MAPPO v3 (issue #53): time-limit truncation bootstrapped (hand-computed GAE, TorchRL's done/terminated
as the oracle, the training loop's cut states replayed), staggered first resets, the linear learning-rate decay
applied to the optimizer, and the separate critic (loss and gradient against the float64 reference)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from icml26.sarl import AirspaceCore, KNNMLPPolicy, SARLPolicy
from icml26.sarl.mappo import PPOConfig, gae_advantages, observe, train

from .test_sarl import _random_ppo_batch

GAMMA, LAM = 0.9, 0.8


def _one_slot(x):
    return torch.tensor(x, dtype=torch.float64).reshape(-1, 1, 1)


def test_gae_with_a_truncation_by_hand():
    """Three decisions of one aircraft slot, its episode cut by the time limit after the second (t = 1), where the
    critic values the cut state at 4.0; the next decision (t = 2) belongs to the next episode. By hand
    (gamma 0.9, lambda 0.8): delta_2 = 3 + 0.9 * 2.0 - 1.5 = 3.3; delta_1 = 2 + 0.9 * 4.0 - 1.0 = 4.6 (bootstrapped
    from the cut state, the recursion stops there); A_0 = (1 + 0.9 * 1.0 - 0.5) + 0.72 * 4.6 = 4.712. Treated as a
    termination, A_1 would be 1.0 and A_0 2.12."""
    rew, val = _one_slot([1.0, 2.0, 3.0]), _one_slot([0.5, 1.0, 1.5])
    last = torch.tensor([[2.0]], dtype=torch.float64)
    done = torch.zeros(3, 1, 1, dtype=torch.bool)
    trunc = done.clone()
    trunc[1] = True
    tval = _one_slot([0.0, 4.0, 0.0])
    alive = torch.ones(3, 1, 1, dtype=torch.bool)
    expected = [4.712, 4.6, 3.3]
    ours = gae_advantages(rew, val, done, alive, last, GAMMA, LAM, truncated=trunc, trunc_value=tval)
    np.testing.assert_allclose(ours.flatten().numpy(), expected, rtol=1e-12)
    pytest.importorskip("torchrl")
    from icml26.sarl.torchrl_loss import gae_torchrl

    adv, target = gae_torchrl(rew, val, done, alive, last, GAMMA, LAM, truncated=trunc, trunc_value=tval)
    # TorchRL's GAE runs its recursion in float32 (agreement ~1e-7)
    np.testing.assert_allclose(adv.flatten().numpy(), expected, rtol=1e-6)
    np.testing.assert_allclose(target.flatten().numpy(), np.add(expected, [0.5, 1.0, 1.5]), rtol=1e-6)
    with pytest.raises(ValueError, match="trunc_value"):
        gae_torchrl(rew, val, done, alive, last, GAMMA, LAM, truncated=trunc)


def test_gae_with_truncations_and_empty_slots_equals_torchrls_functional_gae():
    """Random rollouts with terminations, truncations (value of the cut state given apart) and empty slots: ours,
    the training path's ``MultiAgentGAE`` and TorchRL's functional ``generalized_advantage_estimate`` (``done`` =
    terminated or truncated, the next value of a truncated step the cut state's) agree."""
    tr = pytest.importorskip("torchrl.objectives.value.functional")
    from icml26.sarl.torchrl_loss import gae_torchrl

    g = torch.Generator().manual_seed(2)
    T, B, N = 10, 3, 4
    rew, val, tval = (torch.randn(T, B, N, generator=g, dtype=torch.float64) for _ in range(3))
    last = torch.randn(B, N, generator=g, dtype=torch.float64)
    u = torch.rand(T, B, N, generator=g)
    term, trunc = u < 0.15, (u >= 0.15) & (u < 0.3)
    ours = gae_advantages(
        rew, val, term, torch.ones_like(term), last, GAMMA, LAM, truncated=trunc, trunc_value=tval
    )
    nxt = torch.where(trunc, tval, torch.cat([val[1:], last[None]], 0))
    to_tr = lambda a: a.permute(1, 2, 0).unsqueeze(-1)  # noqa: E731  (T, B, N) -> (B, N, T, 1)
    ref, _ = tr.generalized_advantage_estimate(
        GAMMA, LAM, to_tr(val), to_tr(nxt), to_tr(rew), to_tr(term | trunc), to_tr(term)
    )
    ref = ref.squeeze(-1).permute(2, 0, 1)
    np.testing.assert_allclose(ours.numpy(), ref.numpy(), rtol=1e-5, atol=1e-6)  # TorchRL: float32 inside
    alive = torch.ones(T, B, N, dtype=torch.bool)
    np.testing.assert_allclose(
        gae_torchrl(rew, val, term, alive, last, GAMMA, LAM, truncated=trunc, trunc_value=tval)[0].numpy(),
        ref.numpy(),
        rtol=1e-5,
        atol=1e-6,
    )


def test_training_bootstraps_the_value_of_the_cut_state(monkeypatch):
    """Two circle scenarios with a 5-decision time limit (no aircraft can arrive that soon), no staggering: the
    rollout marks exactly the aircraft flying at decision 5 as truncated there, and the value it bootstraps is the
    critic's value of the state they reached, recomputed by replaying the rollout's actions on a fresh core (not the
    next episode's value)."""
    pytest.importorskip("torchrl")
    from icml26.sarl import torchrl_loss

    make = lambda: AirspaceCore(n_envs=2, n_aircraft=3, scenario="circle", seed=7, max_steps=5)  # noqa: E731
    actions: list[np.ndarray] = []

    def make_recording() -> AirspaceCore:
        core = make()
        step = core.step

        def recorded(a, overridden=None):
            actions.append(np.array(a))
            return step(a, overridden)

        core.step = recorded
        return core

    seen = []
    real = torchrl_loss.gae_torchrl

    def recording(rew, val, done, alive, last, gamma, lam, truncated=None, trunc_value=None):
        replay = make()
        replay.auto_reset = False
        for a in actions[:5]:
            replay.step(a)
        pol.eval()
        with torch.no_grad():
            v = pol(observe(replay, "knn")["knn"])[1]
        seen.append((truncated.clone(), trunc_value.clone(), alive.clone(), done.clone(), v, val.clone()))
        return real(rew, val, done, alive, last, gamma, lam, truncated=truncated, trunc_value=trunc_value)

    monkeypatch.setattr(torchrl_loss, "gae_torchrl", recording)
    torch.manual_seed(0)
    pol = KNNMLPPolicy()
    cfg = PPOConfig(n_envs=2, rollout=8, epochs=1, minibatches=1, stagger=False)
    train(pol, "knn", make_recording, cfg, total_agent_steps=1, seed=0)
    trunc, tval, alive, done, v, val = seen[0]
    expected = torch.zeros_like(trunc)
    expected[4] = alive[4]  # the 5th decision hits the limit with every aircraft still flying
    assert alive[4].sum() == 6
    torch.testing.assert_close(trunc, expected)
    assert done[4].all()
    np.testing.assert_allclose(tval[4].numpy(), v.numpy(), rtol=1e-5, atol=1e-6)
    assert float((tval[4] - val[5]).abs().max()) > 1e-3  # the next episode's value is a different number


def test_staggered_first_resets_put_the_envs_at_different_phases():
    """Four circle scenarios with a 16-decision limit (no arrivals that soon): env b's first episode is cut after
    ceil((b + 1) 16 / 4) = 4, 8, 12, 16 decisions, later episodes run the full 16, so after one 16-decision rollout
    the envs are 12, 8, 4 and 0 decisions into their episodes; without staggering all restart together."""
    pytest.importorskip("torchrl")
    for stagger, phases in ((True, [12, 8, 4, 0]), (False, [0, 0, 0, 0])):
        cores = []

        def make(cores=cores) -> AirspaceCore:
            cores.append(AirspaceCore(n_envs=4, n_aircraft=3, scenario="circle", seed=1, max_steps=16))
            return cores[-1]

        cfg = PPOConfig(n_envs=4, rollout=16, epochs=1, minibatches=1, stagger=stagger)
        train(KNNMLPPolicy(), "knn", make, cfg, total_agent_steps=1, seed=0)
        assert cores[0].t.tolist() == phases, stagger


def test_learning_rate_decays_linearly_in_the_optimizer(monkeypatch):
    """``lr_end_frac = 0.25``: the optimizer steps of iteration k run at lr (1 - 0.75 s_k / total), s_k the
    agent-samples sampled before it (hand formula from the history's sample counts); constant with 1.0."""
    pytest.importorskip("torchrl")
    seen: list[float] = []

    class Recording(torch.optim.Adam):
        def step(self, closure=None):
            seen.append(self.param_groups[0]["lr"])
            return super().step(closure)

    monkeypatch.setattr(torch.optim, "Adam", Recording)
    make = lambda: AirspaceCore(n_envs=2, n_aircraft=3, seed=0)  # noqa: E731
    total = 150
    cfg = PPOConfig(n_envs=2, rollout=8, epochs=1, minibatches=2, lr=1e-3, lr_end_frac=0.25)
    hist = train(KNNMLPPolicy(), "knn", make, cfg, total_agent_steps=total, seed=0)
    assert len(hist) >= 3
    before = [0.0] + [h["agent_steps"] for h in hist[:-1]]
    expected = [1e-3 * (1 - 0.75 * s / total) for s in before for _ in range(2)]
    np.testing.assert_allclose(seen, expected, rtol=1e-12)
    assert seen[0] == 1e-3 and seen[-1] < 0.5e-3
    assert PPOConfig(lr=2e-3, lr_end_frac=0.0).lr_at(30, 40) == pytest.approx(0.5e-3)
    assert PPOConfig(lr=2e-3).lr_at(30, 40) == 2e-3
    with pytest.raises(ValueError, match="lr_end_frac"):
        PPOConfig(lr_end_frac=1.5)
    with pytest.raises(ValueError, match="lr"):
        PPOConfig(lr=0.0)
    with pytest.raises(ValueError, match="rollout"):
        PPOConfig(rollout=0)


@pytest.mark.parametrize("kind", ["graph", "knn"])
def test_separate_critic_loss_and_gradient_equal_the_reference(kind):
    """With a separate critic the TorchRL loss is the reference loss with the actor's logits and the critic's
    values; the actor's own value head gets no gradient, the critic's parameters get the value term's."""
    pytest.importorskip("torchrl")
    from icml26.sarl.reference import ppo_loss_reference
    from icml26.sarl.torchrl_loss import PPOLossTorchRL, pack_batch

    pol, args, obs, amask, act, old, adv, ret, live = _random_ppo_batch(kind)
    torch.manual_seed(1)
    critic = (SARLPolicy() if kind == "graph" else KNNMLPPolicy()).double().eval()
    loss = PPOLossTorchRL(pol, kind, clip=0.2, value_coef=0.5, entropy=0.01, critic=critic)
    total, _ = loss(pack_batch(obs, amask, act, old, adv, ret), live)
    total.backward()
    g_pol = {n: None if p.grad is None else p.grad.clone() for n, p in pol.named_parameters()}
    g_crit = {n: None if p.grad is None else p.grad.clone() for n, p in critic.named_parameters()}
    pol.zero_grad(set_to_none=True)
    critic.zero_grad(set_to_none=True)
    ref = ppo_loss_reference(pol(*args)[0], critic(*args)[1], amask, act, old, adv, ret, live, 0.2, 0.5, 0.01)
    ref.backward()
    assert float(total.detach()) == pytest.approx(float(ref.detach()), rel=1e-7, abs=1e-8)
    for grads, net in ((g_pol, pol), (g_crit, critic)):
        for n, p in net.named_parameters():
            want = torch.zeros_like(p) if p.grad is None else p.grad
            got = torch.zeros_like(p) if grads[n] is None else grads[n]
            np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-6, atol=1e-8, err_msg=n)
    assert all(g_pol[n] is None or not g_pol[n].any() for n in g_pol if n.startswith("critic."))
    assert any(g_crit[n] is not None and g_crit[n].abs().sum() > 0 for n in g_crit if n.startswith("critic."))


def test_training_with_a_separate_critic_trains_it_and_leaves_the_policys_value_head_alone():
    """``separate_critic=True``: the policy's actor and the separate critic's value head move, the policy's own
    value head (unused) does not; a critic without the flag is refused."""
    pytest.importorskip("torchrl")
    torch.manual_seed(0)
    pol, critic = KNNMLPPolicy(), KNNMLPPolicy()
    before = {n: p.detach().clone() for n, p in pol.named_parameters()}
    before_c = {n: p.detach().clone() for n, p in critic.named_parameters()}
    make = lambda: AirspaceCore(n_envs=2, n_aircraft=3, seed=0)  # noqa: E731
    cfg = PPOConfig(n_envs=2, rollout=8, epochs=1, minibatches=1, separate_critic=True)
    train(pol, "knn", make, cfg, total_agent_steps=1, seed=0, critic=critic)
    moved = {n: not torch.equal(before[n], p.detach()) for n, p in pol.named_parameters()}
    moved_c = {n: not torch.equal(before_c[n], p.detach()) for n, p in critic.named_parameters()}
    assert all(moved[n] for n in moved if n.startswith("actor."))
    assert not any(moved[n] for n in moved if n.startswith("critic."))
    assert all(moved_c[n] for n in moved_c if n.startswith("critic."))
    with pytest.raises(ValueError, match="separate_critic"):
        train(pol, "knn", make, PPOConfig(n_envs=2, rollout=8), total_agent_steps=1, critic=critic)


def test_run_tunes_every_learned_arm_on_validation_and_records_the_choice(monkeypatch):
    """``lr_grid`` in the experiment (training stubbed out, so every rate scores the same untrained policy): each
    learned arm is trained once per rate, ties go to the smallest, the low-edge choice extends the grid once and is
    still on the edge, which the result records (``lr``, ``lr_at_edge``) and notes on the headline claim; the
    tuning scenarios are listed as held-out validation units. Bad grids are refused."""
    from icml26.sarl import experiment

    from .test_sarl import SMALL

    seen: list[tuple[str, float]] = []

    def stub(policy, kind, make_core, cfg, *, total_agent_steps, desc=None, **kw):
        seen.append((desc.split()[3], cfg.lr))
        return [{"agent_steps": float(total_agent_steps), "reward": 0.0}]

    monkeypatch.setattr(experiment, "train", stub)
    cfg = dataclasses.replace(
        SMALL, budget=50, eval_episodes=2, eval_episodes_scales=1, lr_grid=(1e-4, 1e-3), tune_episodes=3,
        arm_lr=(), arm_lr_edge=(), select_checkpoint=False,  # the stub never reaches a curve point
    )
    out = experiment.run(cfg)
    learned = ("sarl", "sarl_no_moe", "mlp_knn_kss", "sarl_no_shield")
    assert [lr for arm, lr in seen if arm == "sarl"] == pytest.approx([1e-4, 1e-3, 1e-5])
    assert {arm for arm, _ in seen} == set(learned)
    for arm in learned:
        assert out.metrics[arm]["lr"] == pytest.approx(1e-5) and out.metrics[arm]["lr_at_edge"] == 1.0
        assert arm in out.notes["not_only_the_shield"]
    assert len(out.held_out["episodes"]["validation"]) == 3
    # the smoke code path records a learning curve on seed 0: its flattened flag per arm is noted (no points here)
    assert "learning curves" in out.notes["not_only_the_shield"]
    assert "sarl still moving" in out.notes["not_only_the_shield"]
    for bad in ((1e-3, 1e-4), (1e-3,), (0.0, 1e-3)):
        with pytest.raises(ValueError, match="lr_grid"):
            dataclasses.replace(cfg, lr_grid=bad)


def test_curve_flattened_by_hand():
    """The pre-registered rule: the last two validation points within 2/32; a collapse is not flat."""
    from icml26.sarl.experiment import CURVE_TOL, curve_flattened

    assert CURVE_TOL == 2 / 32
    assert curve_flattened([(1.0, 0.5), (2.0, 0.5625)])  # 2 scenarios in 32: on the tolerance
    assert not curve_flattened([(1.0, 0.5), (2.0, 0.59375)])  # 3 in 32
    assert not curve_flattened([(1.0, 0.7), (2.0, 0.5)])  # collapsing
    assert not curve_flattened([(1.0, 0.5)])  # one point says nothing


def test_run_trains_each_arm_at_its_fixed_rate_under_the_configured_schedule(monkeypatch):
    """``arm_lr`` (the pilot's choice, fixed before the run) reaches each arm's training, an arm not named trains at
    ``lr``, ``lr_end_frac`` reaches ``PPOConfig``, and the result records the rate every learned arm trained at.
    Bad pairs, and ``arm_lr`` beside ``lr_grid``, are refused naming the argument."""
    from icml26.sarl import experiment

    from .test_sarl import SMALL

    seen: dict[str, tuple[float, float]] = {}

    def stub(policy, kind, make_core, cfg, *, total_agent_steps, desc=None, **kw):
        seen[desc.split()[3]] = (cfg.lr, cfg.lr_end_frac)
        return [{"agent_steps": float(total_agent_steps), "reward": 0.0}]

    monkeypatch.setattr(experiment, "train", stub)
    cfg = dataclasses.replace(
        SMALL, budget=50, eval_episodes=2, eval_episodes_scales=1, curve_points=0, select_checkpoint=False, lr=1e-3,
        lr_end_frac=0.0,
        arm_lr=(("sarl", 3e-4), ("mlp_knn_kss", 3e-3)), arm_lr_edge=("sarl",),
    )
    out = experiment.run(cfg)
    want = {"sarl": 3e-4, "sarl_no_moe": 1e-3, "mlp_knn_kss": 3e-3, "sarl_no_shield": 1e-3}
    assert {arm: lr for arm, (lr, _) in seen.items()} == pytest.approx(want)
    assert {end for _, end in seen.values()} == {0.0}
    assert {arm: out.metrics[arm]["lr"] for arm in want} == pytest.approx(want)
    # the pilot chose the rates on tune_episodes validation scenarios: all of them are held out from the test units
    assert len(out.held_out["episodes"]["validation"]) == cfg.tune_episodes > cfg.curve_episodes
    # the pilot's edge flag: recorded for the arms it chose, noted on the headline
    assert {arm: out.metrics[arm].get("lr_at_edge") for arm in want} == {
        "sarl": 1.0, "sarl_no_moe": None, "mlp_knn_kss": 0.0, "sarl_no_shield": None}
    assert "on the edge of its grid after its extension for sarl (0.0003)" in out.notes["not_only_the_shield"]
    with pytest.raises(ValueError, match="arm_lr_edge"):
        dataclasses.replace(cfg, arm_lr_edge=("sarl_no_moe",))
    for bad in ((("nope", 1e-3),), (("sarl", 0.0),), (("sarl", 1e-3), ("sarl", 3e-4)), ("sarl",)):
        with pytest.raises(ValueError, match="arm_lr"):
            dataclasses.replace(cfg, arm_lr=bad)
    with pytest.raises(ValueError, match="arm_lr and lr_grid"):
        dataclasses.replace(cfg, lr_grid=(1e-4, 1e-3), arm_lr_edge=())
    with pytest.raises(ValueError, match="lr_end_frac"):
        dataclasses.replace(cfg, lr_end_frac=-0.5)


def test_best_checkpoint_keeps_a_copy_of_the_first_maximum():
    """Early stopping on validation (README Deviation 12): the first of equal maxima, a copy that later training
    does not change, restored exactly; the edge flag at the first and last point; bad input refused."""
    from icml26.sarl.experiment import BestCheckpoint

    net = torch.nn.Linear(2, 1)
    best = BestCheckpoint()
    states = []
    for step, score in ((10, 0.2), (20, 0.6), (30, 0.6), (40, 0.1)):
        with torch.no_grad():
            net.weight.fill_(float(step))  # in place, as an optimiser step changes the weights
        states.append(net.weight.detach().clone())
        best.record(step, score, net)
    assert (best.step, best.index, best.score, best.n) == (20, 1, 0.6, 4)
    assert not best.at_edge
    best.restore(net)
    assert torch.equal(net.weight, states[1])
    edge = BestCheckpoint()
    for step, score in ((10, 0.5), (20, 0.5)):
        edge.record(step, score, net)
    assert edge.step == 10 and edge.at_edge  # ties go to the smaller budget, an edge of the curve
    with pytest.raises(ValueError, match="finite"):
        BestCheckpoint().record(1, float("nan"), net)
    with pytest.raises(RuntimeError, match="record"):
        BestCheckpoint().restore(net)


def test_run_evaluates_each_arm_at_its_best_validation_checkpoint(monkeypatch):
    """With ``select_checkpoint`` the policy each arm is evaluated with is its state at the best curve point (the
    validation success is stubbed to peak at the first point of every arm), the chosen budget and its edge flag are
    recorded per arm and noted on the headline; without it the policy at the end of the budget is evaluated."""
    from icml26.sarl import experiment

    from .test_sarl import SMALL

    cfg = dataclasses.replace(SMALL, budget=600, eval_episodes=2, eval_episodes_scales=1, curve_points=3,
                              curve_episodes=2, select_checkpoint=True)
    calls = {"n": 0}

    def val(act, shielded, core, seeds):
        calls["n"] += 1
        return 1.0 if calls["n"] % 3 == 2 else 0.0  # greedy_kss first, then 1, 0, 0 per learned arm

    restored: list[int] = []
    real_restore = experiment.BestCheckpoint.restore

    def restore(self, module):
        restored.append(self.index)
        real_restore(self, module)

    monkeypatch.setattr(experiment, "validation_success", val)
    monkeypatch.setattr(experiment.BestCheckpoint, "restore", restore)
    out = experiment.run(cfg)
    assert restored == [0, 0, 0, 0]
    for arm in experiment.LEARNED_ARMS:
        curve = out.series["val_curves"][arm]
        assert [s for _, s in curve] == [1.0, 0.0, 0.0]
        assert out.metrics[arm]["budget_chosen"] == curve[0][0] and out.metrics[arm]["budget_at_edge"] == 1.0
        assert out.metrics[arm]["val_success_chosen"] == 1.0
    assert "checkpoint chosen on validation" in out.notes["not_only_the_shield"]
    restored.clear()
    plain = experiment.run(dataclasses.replace(cfg, select_checkpoint=False, curve_seed=cfg.seed))
    assert restored == [] and "budget_chosen" not in plain.metrics["sarl"]
    with pytest.raises(ValueError, match="select_checkpoint"):
        dataclasses.replace(cfg, curve_points=1)
