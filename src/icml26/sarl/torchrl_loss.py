"""The PPO objective and the advantages through TorchRL: ``MAPPOLoss`` (TorchRL's ``ClipPPOLoss`` specialised to a
centralised critic, ``torchrl.objectives.multiagent``) and ``MultiAgentGAE``, fed from this package's batched
rollouts.

Our rollouts stay batched (``AirspaceCore`` steps B scenarios x N aircraft at once; TorchRL's ``PettingZooWrapper``
steps one scenario through per-agent dicts, see ``benchmarks/sarl.py``); each rollout is packed into a
``TensorDict`` with the multi-agent keys (``("agents", "action")``, ``("agents", "sample_log_prob")``,
``("agents", "advantage")`` ...) and TorchRL computes

    A_t = sum_k (gamma lam)^k (1 - d)... delta_{t+k},   delta_t = r_t + gamma (1 - term_t) V(s_{t+1}) - V(s_t)
    L = -min(rho A, clip(rho, 1 - eps, 1 + eps) A) + c_v (V - (A + V_old))^2 - c_H H(pi)

per agent-sample (``reduction="none"``; ``d`` = done, ``term`` = terminated: a time-limit cut is done but not
terminated, so its target bootstraps the value of the state where it was cut); empty aircraft slots are masked out
of the mean here. The shield's safe set masks the logits inside the actor (the same mask as in the rollout), so the
ratio is computed under it. The critic is the policy's value head (shared encoder) or a separate network.
Needs the ``marl`` extra (torchrl, tensordict); imported lazily by ``mappo.train``.

Reference: Schulman et al., "Proximal Policy Optimization Algorithms", arXiv 1707.06347 (eq. 7); Schulman et al.,
"High-Dimensional Continuous Control Using Generalized Advantage Estimation", ICLR 2016 (eq. 16); Yu et al., "The
Surprising Effectiveness of PPO in Cooperative Multi-Agent Games" (MAPPO), NeurIPS 2022.

Example:
    >>> import torch
    >>> from icml26.sarl.policy import KNNMLPPolicy
    >>> loss = PPOLossTorchRL(KNNMLPPolicy(), "knn", clip=0.2, value_coef=0.5, entropy=0.01)
    >>> M, N = 2, 3
    >>> td = pack_batch({"knn": torch.randn(M, N, 52)}, torch.ones(M, N, 8, dtype=torch.bool),
    ...                 torch.zeros(M, N, dtype=torch.long), torch.full((M, N), -2.08), torch.randn(M, N),
    ...                 torch.randn(M, N))
    >>> total, parts = loss(td, torch.ones(M, N, dtype=torch.bool))
    >>> bool(torch.isfinite(total))
    True
"""

from __future__ import annotations

from typing import Any

import torch
from tensordict import TensorDict
from tensordict.nn import TensorDictModule
from torch import nn
from torchrl.modules import ProbabilisticActor
from torchrl.objectives.multiagent import MAPPOLoss
from torchrl.objectives.value import MultiAgentGAE

GRAPH_KEYS = ("x", "e", "mask", "alive", "ctx")
KNN_KEYS = ("knn",)


def _keys(kind: str) -> tuple[str, ...]:
    return KNN_KEYS if kind == "knn" else GRAPH_KEYS


class _Joint:
    """One forward pass of the shared policy per batch: the actor computes logits, value and the MoE auxiliary loss
    together; the critic reuses that value when it is called on the same inputs (the loss calls the actor first),
    so the encoder runs once per minibatch and the value loss trains the shared encoder, as in the original loop."""

    def __init__(self, policy: nn.Module, kind: str):
        self.policy, self.kind = policy, kind
        self.cache: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
        self.misses = 0

    def __call__(self, *obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if self.kind == "knn":
            logits, value, aux = self.policy(obs[0])
        else:
            logits, value, aux = self.policy(*obs)
        self.cache = (obs[0], value, aux)
        return logits, value, aux


class _ActorLogits(nn.Module):
    def __init__(self, joint: _Joint):
        super().__init__()
        self.policy = joint.policy  # registers the parameters
        self.joint = joint

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        *obs, amask = inputs
        logits = self.joint(*obs)[0]
        return logits.masked_fill(~amask, -1e9)


class _CriticValue(nn.Module):
    def __init__(self, joint: _Joint, critic: nn.Module | None = None):
        super().__init__()
        self.joint = joint
        self.critic = critic  # a separate critic network (its value output), or None: the policy's value head

    def forward(self, *obs: torch.Tensor) -> torch.Tensor:
        if self.critic is not None:
            return (self.critic(obs[0]) if self.joint.kind == "knn" else self.critic(*obs))[1][..., None]
        c = self.joint.cache
        if c is not None and c[0] is obs[0]:
            return c[1][..., None]
        self.joint.misses += 1
        return self.joint(*obs)[1][..., None]


def pack_batch(
    obs: dict[str, torch.Tensor],
    amask: torch.Tensor,
    act: torch.Tensor,
    logp: torch.Tensor,
    adv: torch.Tensor,
    ret: torch.Tensor,
) -> TensorDict:
    """A minibatch of M scenes x N aircraft slots as a TensorDict with the multi-agent keys (batch ``[M]``, the
    ``"agents"`` group ``[M, N]``); ``adv`` and ``ret`` become ``("agents", "advantage")`` and
    ``("agents", "value_target")`` with a trailing feature dimension, as in TorchRL's MAPPO tutorial."""
    M, N = act.shape
    agents = {k: v for k, v in obs.items()}
    agents.update(
        action_mask=amask,
        action=act,
        sample_log_prob=logp,
        advantage=adv[..., None],
        value_target=ret[..., None],
    )
    return TensorDict({"agents": TensorDict(agents, [M, N])}, [M])


class PPOLossTorchRL:
    """TorchRL's ``MAPPOLoss`` (clipped PPO, centralised critic) over a shared-parameter policy (``SARLPolicy`` or
    ``KNNMLPPolicy``). Advantages arrive normalised over live slots (``normalize_advantage=False`` here: TorchRL's
    normalisation would count empty slots); no value normalisation.

    Args:
        policy: the ``nn.Module`` returning ``(logits, value, aux)``.
        kind: ``"graph"`` or ``"knn"`` (the policy's inputs).
        critic: optional separate critic (a network of the same signature, e.g. a copy of ``policy``) whose value
            output is the state value; ``None`` (the default) uses ``policy``'s value head on the actor's forward
            pass (shared encoder).
        clip: PPO clip epsilon.
        value_coef: weight of the squared value error.
        entropy: weight of the entropy bonus.

    Returns (``__call__(td, live)``): the masked mean loss (policy + value + entropy; the MoE auxiliary loss is
    returned separately in ``parts["aux"]``) and a dict of its parts.
    """

    def __init__(
        self,
        policy: nn.Module,
        kind: str,
        *,
        clip: float,
        value_coef: float,
        entropy: float,
        critic: nn.Module | None = None,
    ):
        self.kind = kind
        self.joint = _Joint(policy, kind)
        in_keys: list[Any] = [("agents", k) for k in _keys(kind)]
        actor = ProbabilisticActor(
            TensorDictModule(
                _ActorLogits(self.joint),
                in_keys=[*in_keys, ("agents", "action_mask")],
                out_keys=[("agents", "logits")],
            ),
            in_keys={"logits": ("agents", "logits")},
            out_keys=[("agents", "action")],
            distribution_class=torch.distributions.Categorical,
            return_log_prob=True,
            log_prob_key=("agents", "sample_log_prob"),
        )
        critic = TensorDictModule(
            _CriticValue(self.joint, critic), in_keys=in_keys, out_keys=[("agents", "state_value")]
        )
        self.loss = MAPPOLoss(
            actor,
            critic,
            clip_epsilon=clip,
            entropy_bonus=True,
            entropy_coeff=entropy,
            critic_coeff=value_coef,
            loss_critic_type="l2",
            normalize_advantage=False,
            value_norm=None,
            reduction="none",
            functional=False,
        )
        self.loss.set_keys(
            action=("agents", "action"),
            sample_log_prob=("agents", "sample_log_prob"),
            value=("agents", "state_value"),
            advantage=("agents", "advantage"),
            value_target=("agents", "value_target"),
        )

    def __call__(self, td: TensorDict, live: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        self.joint.cache = None
        out = self.loss(td)
        aux = self.joint.cache[2] if self.joint.cache is not None else torch.zeros(())
        self.joint.cache = None
        m = live.float()
        n = m.sum().clamp(min=1)

        def masked(v: torch.Tensor) -> torch.Tensor:
            return (v.reshape(m.shape) * m).sum() / n

        parts = {
            "policy": masked(out["loss_objective"]),
            "value_loss": masked(out["loss_critic"]),  # already times value_coef
            "entropy_loss": masked(out["loss_entropy"]),  # already times -entropy
            "aux": aux,
        }
        return parts["policy"] + parts["value_loss"] + parts["entropy_loss"], parts


def gae_torchrl(
    rew: torch.Tensor,
    val: torch.Tensor,
    done: torch.Tensor,
    alive: torch.Tensor,
    last_value: torch.Tensor,
    gamma: float,
    lam: float,
    truncated: torch.Tensor | None = None,
    trunc_value: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Advantages and value targets (time first, ``(T, B, N)``) from TorchRL's ``MultiAgentGAE`` module (per-agent
    rewards, so it runs the plain GAE recursion along time).

    An empty slot at t gets reward 0, value 0 and done, so it contributes nothing and passes nothing back (a slot
    reused after a reset never bootstraps into the previous aircraft), as ``mappo.gae_advantages``. A slot
    ``truncated`` at t (its episode cut by the time limit, a subset of ``done``) is TorchRL's ``done`` but not
    ``terminated``: the recursion stops there, and the one-step target bootstraps ``trunc_value[t]``, the value of
    the state where it was cut (TorchRL's convention, ``done = terminated | truncated``).
    """
    a = alive
    r = torch.where(a, rew, torch.zeros_like(rew))
    v = torch.where(a, val, torch.zeros_like(val))
    nv = torch.cat([v[1:], last_value[None]], 0)
    d = done | ~a
    term = d
    if truncated is not None:
        if trunc_value is None or trunc_value.shape != rew.shape:
            raise ValueError("trunc_value must be given with truncated, shaped like rew")
        # a time-limit cut: V(s_{t+1}) is the value of the state where the episode was cut (not the next episode's)
        nv = torch.where(truncated, trunc_value, nv)
        d = d | truncated
        term = d & ~(truncated & a)

    def tr(x: torch.Tensor) -> torch.Tensor:  # (T, B, N) -> (B, N, T, 1): time last in the batch
        return x.permute(1, 2, 0).unsqueeze(-1)

    td = TensorDict(
        {
            "state_value": tr(v),
            "next": {"state_value": tr(nv), "reward": tr(r), "done": tr(d), "terminated": tr(term)},
        },
        list(tr(v).shape[:-1]),
    )
    with torch.no_grad():
        MultiAgentGAE(gamma=gamma, lmbda=lam, value_network=None, agent_dim=1)(td)

    def back(x: torch.Tensor) -> torch.Tensor:
        return x.squeeze(-1).permute(2, 0, 1)

    adv = back(td["advantage"]) * a
    return adv, back(td["value_target"]) * a
