"""Shared-parameter MAPPO over the batched airspace, and greedy evaluation with or without the shield.

One policy for every aircraft (CTDE: a centralised critic for the graph policies). Rollouts of ``rollout`` decisions
over ``n_envs`` scenarios; GAE per aircraft slot with done = arrived or episode end (never bootstrapping across a
slot reused after a reset; an episode cut by its time limit is truncated, not terminated: its last target
bootstraps the value of the state where it was cut); empty slots are masked out of every loss. Each env resets on
its own when its episode ends, and the first episodes are cut at staggered times (``PPOConfig.stagger``), so the
envs run at different phases; the learning rate may decay linearly (``lr_end_frac``), and the critic may be a
separate network (``separate_critic``). With ``shield_train`` the Kinematic Safety
Shield's safe set masks the logits (preemptive shield) and the mask is stored with the observation, so the PPO
ratio is computed under the same mask. Budgets are counted in agent-samples (live aircraft decisions).

The rollouts are this package's (batched over scenarios and aircraft); the advantages and the clipped PPO loss are
TorchRL's (``MultiAgentGAE`` and ``MAPPOLoss``, ``sarl.torchrl_loss``; the ``marl`` extra). The hand-written
``gae_advantages`` here and ``sarl.reference.ppo_loss_reference`` are the references they are tested against.

Example:
    >>> from icml26.sarl.policy import KNNMLPPolicy
    >>> cfg = PPOConfig(n_envs=4, rollout=8, epochs=1, minibatches=1)
    >>> hist = train(KNNMLPPolicy(), "knn", lambda: AirspaceCore(n_envs=4, n_aircraft=3, seed=0), cfg,
    ...              total_agent_steps=50, seed=0)
    >>> hist[-1]["agent_steps"] >= 50
    True
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ..common.progress import progress
from .env import N_ACTIONS, AirspaceCore
from .shield import KinematicSafetyShield


@dataclass
class PPOConfig:
    """MAPPO settings (``train``).

    The learning rate of iteration k decays linearly in the share of the budget already sampled,
    ``lr_k = lr (1 - (1 - lr_end_frac) min(steps_k / total, 1))`` (``lr_end_frac = 1``: constant; ``0``: to zero,
    CleanRL's ``anneal_lr``). ``stagger``: environment b's first episode is cut (a truncation) after
    ``ceil((b + 1) max_steps / n_envs)`` decisions, so the environments run at different phases of their episodes
    and a rollout mixes early and late decisions. ``separate_critic``: the value comes from a separate copy of the
    policy network (its own encoder) instead of the policy's value head on the shared encoder.
    """

    n_envs: int = 64
    rollout: int = 32
    gamma: float = 0.99
    lam: float = 0.95
    clip: float = 0.2
    entropy: float = 0.01
    value_coef: float = 0.5
    aux_coef: float = 0.01
    lr: float = 3e-4
    epochs: int = 4
    minibatches: int = 4
    grad_clip: float = 0.5
    lr_end_frac: float = 1.0
    stagger: bool = True
    separate_critic: bool = False

    def __post_init__(self) -> None:
        for name in ("n_envs", "rollout", "epochs", "minibatches"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be a positive int, got {v!r}")
        if not (np.isfinite(self.lr) and self.lr > 0):
            raise ValueError(f"lr must be a positive finite number, got {self.lr!r}")
        if not 0.0 <= self.lr_end_frac <= 1.0:
            raise ValueError(f"lr_end_frac must lie in [0, 1], got {self.lr_end_frac!r}")

    def lr_at(self, steps: float, total: float) -> float:
        """The learning rate of an iteration that starts after ``steps`` of ``total`` agent-samples."""
        # lr_k = lr (1 - (1 - lr_end_frac) p_k),  p_k = min(steps_k / total, 1)
        return self.lr * (1.0 - (1.0 - self.lr_end_frac) * min(steps / total, 1.0))


def observe(core: AirspaceCore, kind: str) -> dict[str, torch.Tensor]:
    """The policy inputs for every slot: graph (x, e, mask, alive, ctx) or k-NN features."""
    if kind == "knn":
        return {"knn": torch.from_numpy(core.knn_features())}
    geom = core.pairwise()
    e, mask = core.edge_features(geom)
    return {
        "x": torch.from_numpy(core.node_features()),
        "e": torch.from_numpy(e),
        "mask": torch.from_numpy(mask),
        "alive": torch.from_numpy(core.alive.copy()),
        "ctx": torch.from_numpy(core.context(geom)),
    }


def forward(
    policy: Any, kind: str, obs: dict[str, torch.Tensor]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    if kind == "knn":
        return policy(obs["knn"])
    return policy(obs["x"], obs["e"], obs["mask"], obs["alive"], obs["ctx"])


def gae_advantages(
    rew: torch.Tensor,
    val: torch.Tensor,
    done: torch.Tensor,
    alive: torch.Tensor,
    last_value: torch.Tensor,
    gamma: float,
    lam: float,
    truncated: torch.Tensor | None = None,
    trunc_value: torch.Tensor | None = None,
) -> torch.Tensor:
    """Generalised advantage estimates per slot, time first (T, ...).

    ``A_t = delta_t + gamma lam (1 - d_t) A_{t+1}``, ``delta_t = r_t + gamma (1 - term_t) V_{t+1} - V_t``
    (Schulman et al. 2016, eq. 16, with episode ends ``d_t``), ``V_T`` = ``last_value``; a slot that is empty at t
    gets 0 and passes nothing back, so an estimate never crosses a slot reused after a reset. A slot ``truncated``
    at t (cut by the time limit) ends its recursion there (``d_t = 1``) but is not terminated: ``V_{t+1}`` is
    ``trunc_value[t]``, the value of the state where it was cut (TorchRL's ``done`` / ``terminated``). Tested against
    TorchRL's ``generalized_advantage_estimate``; training uses TorchRL's ``MultiAgentGAE`` module
    (``sarl.torchrl_loss.gae_torchrl``), tested equal to this function.
    """
    if truncated is not None and (trunc_value is None or trunc_value.shape != rew.shape):
        raise ValueError("trunc_value must be given with truncated, shaped like rew")
    adv = torch.zeros_like(rew)
    gae = torch.zeros_like(rew[0])
    for t in reversed(range(rew.shape[0])):
        next_val = last_value if t == rew.shape[0] - 1 else val[t + 1]
        ended = done[t]
        terminal = done[t]
        if truncated is not None:
            next_val = torch.where(truncated[t], trunc_value[t], next_val)
            ended = ended | truncated[t]
            terminal = ended & ~truncated[t]
        nonterminal, notdone = (~terminal).to(rew.dtype), (~ended).to(rew.dtype)
        # delta_t = r_t + gamma V(s_{t+1}) (1 - term_t) - V(s_t);  A_t = delta_t + gamma lam (1 - d_t) A_{t+1}
        delta = rew[t] + gamma * next_val * nonterminal - val[t]
        gae = delta + gamma * lam * notdone * gae
        gae = gae * alive[t].float()
        adv[t] = gae
    return adv


def _masked_logits(logits: torch.Tensor, action_mask: torch.Tensor) -> torch.Tensor:
    return logits.masked_fill(~action_mask, -1e9)


def train(
    policy: Any,
    kind: str,
    make_core: Callable[[], AirspaceCore],
    cfg: PPOConfig,
    *,
    total_agent_steps: int,
    seed: int = 0,
    shield_train: bool = False,
    desc: str | None = None,
    callback: Callable[[int, dict[str, float]], dict[str, float] | None] | None = None,
    critic: Any = None,
) -> list[dict[str, float]]:
    """Train ``policy`` for ``total_agent_steps`` agent-samples; returns per-iteration statistics.

    The PPO loss is TorchRL's ``MAPPOLoss`` (clipped PPO, centralised critic) and the advantages TorchRL's
    ``MultiAgentGAE`` (``sarl.torchrl_loss``), over this package's batched rollouts. ``callback(iteration, stats)``, called after every PPO
    update (e.g. an evaluation on validation scenarios for a learning curve), may return entries added to that
    iteration's statistics. With ``cfg.separate_critic`` the values come from ``critic`` (a network of the
    policy's signature, trained alongside; default: a copy of ``policy`` made here).
    """
    if kind not in ("graph", "knn"):
        raise ValueError(f"kind must be 'graph' or 'knn', got {kind!r}")
    if critic is not None and not cfg.separate_critic:
        raise ValueError("critic is given but cfg.separate_critic is False")
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    core = make_core()
    core.auto_reset = False  # resets here, after the value of a cut episode's last state is read
    shield = KinematicSafetyShield(core) if shield_train else None
    if cfg.separate_critic and critic is None:
        critic = copy.deepcopy(policy)  # its own parameters from here on (same initial weights)
    params = list(policy.parameters()) + (list(critic.parameters()) if critic is not None else [])
    opt = torch.optim.Adam(params, lr=cfg.lr)
    from . import torchrl_loss  # TorchRL (the marl extra), imported only to train

    loss_fn = torchrl_loss.PPOLossTorchRL(
        policy, kind, clip=cfg.clip, value_coef=cfg.value_coef, entropy=cfg.entropy, critic=critic
    )

    def values(obs: dict[str, torch.Tensor], from_policy: torch.Tensor) -> torch.Tensor:
        return from_policy if critic is None else forward(critic, kind, obs)[1]

    # the time limit of each env's current episode: staggered first episodes put the envs at different phases
    limit = np.full(core.B, core.max_steps)
    if cfg.stagger:
        limit = np.ceil((np.arange(core.B) + 1) * core.max_steps / core.B).astype(int)
    history: list[dict[str, float]] = []
    steps = 0
    bar = progress(total=total_agent_steps, desc=desc) if desc else None
    while steps < total_agent_steps:
        lr = cfg.lr_at(steps, total_agent_steps)
        for group in opt.param_groups:
            group["lr"] = lr
        buf: dict[str, list[Any]] = {
            k: [] for k in ("obs", "amask", "act", "logp", "val", "rew", "done", "alive", "trunc", "tval")
        }
        policy.eval()
        if critic is not None:
            critic.eval()
        with torch.no_grad():
            for _ in range(cfg.rollout):
                obs = observe(core, kind)
                amask = (
                    torch.from_numpy(shield.safe_mask())
                    if shield is not None
                    else torch.ones(core.B, core.N, N_ACTIONS, dtype=torch.bool)
                )
                logits, value, _ = forward(policy, kind, obs)
                value = values(obs, value)
                dist = torch.distributions.Categorical(logits=_masked_logits(logits, amask))
                u = torch.rand(core.B, core.N, 1, generator=gen)
                act = (dist.probs.cumsum(-1) < u).sum(-1).clamp(max=N_ACTIONS - 1)
                alive = torch.from_numpy(core.alive.copy())
                r, agent_done, env_done, _, _ = core.step(act.numpy())
                # an episode ends by arrivals (every aircraft out: terminated) or by its time limit (truncated:
                # the aircraft still flying are cut, and their value target bootstraps V of the state they reached)
                ended = env_done | (core.t >= limit)
                cut = alive.numpy() & core.alive & ended[:, None]
                tval = torch.zeros(core.B, core.N)
                if cut.any():
                    o = observe(core, kind)
                    tval = values(o, forward(policy, kind, o)[1])
                buf["obs"].append(obs)
                buf["amask"].append(amask)
                buf["act"].append(act)
                buf["logp"].append(dist.log_prob(act))
                buf["val"].append(value)
                buf["rew"].append(torch.from_numpy(r))
                buf["done"].append(torch.from_numpy(agent_done | ended[:, None]))
                buf["alive"].append(alive)
                buf["trunc"].append(torch.from_numpy(cut))
                buf["tval"].append(tval)
                if ended.any():  # (an episode cut by a staggered limit is not logged in core.finished)
                    core.reset(ended)
                    limit[ended] = core.max_steps
            o = observe(core, kind)
            last_value = values(o, forward(policy, kind, o)[1])
        n_new = int(torch.stack(buf["alive"]).sum())
        steps += n_new
        if bar is not None:
            bar.update(n_new)
        # GAE per slot, through TorchRL's GAE module (empty slots pass nothing back; cut episodes bootstrap)
        rew, val, done, alive, trunc, tval = (
            torch.stack(buf[k]) for k in ("rew", "val", "done", "alive", "trunc", "tval")
        )
        adv, ret = torchrl_loss.gae_torchrl(
            rew, val, done, alive, last_value, cfg.gamma, cfg.lam, truncated=trunc, trunc_value=tval
        )
        live = alive.float()
        a_mean = (adv * live).sum() / live.sum().clamp(min=1)
        a_std = (((adv - a_mean) ** 2 * live).sum() / live.sum().clamp(min=1)).sqrt().clamp(min=1e-6)
        adv = (adv - a_mean) / a_std
        # PPO epochs over minibatches of whole scenes; the loss is TorchRL's MAPPOLoss (centralised critic)
        policy.train()
        if critic is not None:
            critic.train()
        flat = {k: torch.stack([o[k] for o in buf["obs"]]).flatten(0, 1) for k in buf["obs"][0]}
        amask_f, act_f, logp_f = (torch.stack(buf[k]).flatten(0, 1) for k in ("amask", "act", "logp"))
        # an empty slot keeps every action (its terms are masked out; a fully masked row would be undefined)
        amask_f = amask_f | ~alive.flatten(0, 1)[..., None]
        adv_f, ret_f, live_f = adv.flatten(0, 1), ret.flatten(0, 1), alive.flatten(0, 1)
        stats: dict[str, list[float]] = {"policy": [], "value": [], "entropy": [], "aux": []}
        for _ in range(cfg.epochs):
            order = torch.randperm(act_f.shape[0], generator=gen)
            for idx in order.chunk(cfg.minibatches):
                td = torchrl_loss.pack_batch(
                    {k: v[idx] for k, v in flat.items()},
                    amask_f[idx],
                    act_f[idx],
                    logp_f[idx],
                    adv_f[idx],
                    ret_f[idx],
                )
                ppo_loss, parts = loss_fn(td, live_f[idx])
                aux = parts["aux"]
                loss = ppo_loss + cfg.aux_coef * aux
                if not torch.isfinite(loss):
                    raise FloatingPointError("PPO loss is not finite")
                opt.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
                opt.step()
                stats["policy"].append(float(parts["policy"].detach()))
                stats["value"].append(float(parts["value_loss"].detach()) / cfg.value_coef)
                stats["entropy"].append(-float(parts["entropy_loss"].detach()) / max(cfg.entropy, 1e-12))
                stats["aux"].append(float(aux.detach()))
        done_eps = core.finished[-64:]
        history.append(
            {
                "agent_steps": float(steps),
                **{k: float(np.mean(v)) for k, v in stats.items()},
                "success": float(np.mean([e["success"] for e in done_eps])) if done_eps else float("nan"),
                # mean reward per live agent-decision of this iteration's rollout
                "reward": float((rew * live).sum() / live.sum().clamp(min=1)),
                "lr": lr,
            }
        )
        if callback is not None:
            history[-1].update(callback(len(history) - 1, history[-1]) or {})
    if bar is not None:
        bar.close()
    return history


def evaluate_episodes(
    act_fn: Callable[[AirspaceCore], np.ndarray],
    make_core: Callable[[], AirspaceCore],
    *,
    episode_seeds: Sequence[Any],
    shield_eval: bool,
) -> list[dict[str, float]]:
    """Run ``act_fn`` (core -> (B, N) actions) on one seeded scenario per entry of ``episode_seeds``; returns
    each episode's metrics (``AirspaceCore.episode_metrics``) in the order of ``episode_seeds``.

    Episode i's scenario depends on ``episode_seeds[i]`` only (``AirspaceCore.reset(..., seeds=...)``), so two
    policies evaluated with the same seeds meet the same scenarios and their episodes pair by index. Scenarios run
    in batches of the core's ``n_envs``; every scenario runs to its end (no finishing-order selection).
    """
    core = make_core()
    core.auto_reset = False
    shield = KinematicSafetyShield(core) if shield_eval else None
    seeds = list(episode_seeds)
    out: list[dict[str, float]] = []
    for start in range(0, len(seeds), core.B):
        batch = seeds[start : start + core.B]
        k = len(batch)
        core.reset(np.ones(core.B, bool), seeds=batch + [batch[-1]] * (core.B - k))
        core.alive[k:] = False  # padding envs of a short last batch
        done = np.arange(core.B) >= k
        metrics: list[dict[str, float] | None] = [None] * k
        while not done.all():
            a = act_fn(core)
            overridden = None
            if shield is not None:
                a, overridden = shield.filter(a)
            env_done = core.step(a, overridden)[2]
            core.finished.clear()
            for b in np.nonzero(env_done & ~done)[0]:
                metrics[b] = core.episode_metrics(int(b))
                core.alive[b] = False  # finished: it no longer flies or interacts
            done |= env_done
        out.extend(m for m in metrics if m is not None)
    return out


def evaluate(
    act_fn: Callable[[AirspaceCore], np.ndarray],
    make_core: Callable[[], AirspaceCore],
    *,
    episodes: int,
    shield_eval: bool,
    episode_seed: int = 0,
) -> dict[str, float]:
    """Mean metrics of ``act_fn`` over ``episodes`` seeded scenarios (seeds ``(episode_seed, i)``; NaN-aware)."""
    eps = evaluate_episodes(
        act_fn, make_core, episode_seeds=[(episode_seed, i) for i in range(episodes)], shield_eval=shield_eval
    )
    out = {
        k: float(np.nanmean([e[k] for e in eps])) if any(np.isfinite(e[k]) for e in eps) else float("nan")
        for k in eps[0]
    }
    out.pop("n", None)
    return out


def greedy_policy(policy: Any, kind: str, shield_mask: bool = False) -> Callable[[AirspaceCore], np.ndarray]:
    """Argmax actions of a trained policy (optionally under the shield's training mask)."""

    def act(core: AirspaceCore) -> np.ndarray:
        with torch.no_grad():
            policy.eval()
            logits = forward(policy, kind, observe(core, kind))[0]
            if shield_mask:
                logits = _masked_logits(logits, torch.from_numpy(KinematicSafetyShield(core).safe_mask()))
            return logits.argmax(-1).numpy()

    return act


def fly_straight(core: AirspaceCore) -> np.ndarray:
    return np.zeros((core.B, core.N), dtype=int)


def greedy_direct(core: AirspaceCore) -> np.ndarray:
    """Direct-to the exit when more than 5 deg off track, else maintain (the rule-based reference)."""
    x = core.node_features()
    return np.where(np.abs(np.arctan2(x[..., 1], x[..., 0])) > np.radians(5), 7, 0)
