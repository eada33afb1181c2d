"""The RePO loss (regret-based preference optimisation) on per-token log-probabilities, and its baselines' losses.

For a completion y = (y_1..y_T) (completion tokens only, 1-based t), with l_t = log pi_theta(y_t | x, y_<t),
b_t = log mu(y_t | x, y_<t) under the behaviour policy mu that generated y, and l^ref_t under the reference:

    k_t   = 1 / (T - t + 1) * sum_{s = t..T} (b_s - l_s)        tail term (remaining window, t included)
    r_t   = l_t - k_t                                            negative per-step regret estimate
    S(y)  = (1 / T) sum_t r_t                                     normalisation "mean" (the official default)
    Sref  = (1 / T) sum_t l^ref_t                                 no tail term
    R(y)  = alpha (S(y) - c_ref Sref(y))
    L     = -log sigmoid(R(y_w) - lambda R(y_l)) + c_sft NLL(y_w)

RePO_det (the behaviour-free variant) sets b_t = 0. Summed over t, the tail term of the sampled variant is
S(y) = (1/T) sum_s (1 + w_s) l_s - (1/T) sum_s w_s b_s with w_s = sum_{t<=s} 1/(T-t+1): the behaviour
log-probs b_s only add a per-sequence constant, so RePO and RePO_det have the same gradient.

RePO-top-k (the official ``RePO_Loss_topk``, reconstructed) replaces the one-sample estimate b_s - l_s by the
KL between the behaviour policy and pi_theta over mu's top-k tokens V_s at each position:

    d_s   = sum_{v in V_s} mu_s(v) (log mu_s(v) - log pi_theta,s(v))              top-k part
          + m^mu_s (log m^mu_s - log m^pi_s)                                   uniform tail (official)
    m^mu_s = 1 - sum_{v in V_s} mu_s(v) + eps,   m^pi_s = 1 - sum_{v in V_s} pi_theta,s(v) + eps
    k_t   = 1 / (T - t + 1) * sum_{s = t..T} d_s

The tail term is the official ``estimate_kl_divergence_batchwise`` (``openrlhf/models/utils.py``): the mass outside
the top k, spread uniformly over the other V - k tokens by both policies (the V - k cancels when both share the
vocabulary), eps = 1e-9, each top-k mass clamped to at most 1. With V_s the whole vocabulary it is the exact
KL(mu || pi). mu enters the gradient token by token.

The chosen-NLL term (``c_sft``) is pooled over tokens by default, as TRL's ``loss_type="sft"`` and the official
trainer (OpenRLHF's ``GPTLMLoss``, a token-mean cross-entropy) do: NLL = -sum_{i, t} m_it l_it / sum_{i, t} m_it
over the chosen rows of the batch; ``nll_pooling="sequence"`` averages each response's mean token NLL instead.

Rows of every (2B, T) tensor are ordered [chosen; rejected]; ``mask``
marks completion tokens (right padding allowed); top-k tensors are (2B, T, k).

Example:
    >>> import torch
    >>> logps = torch.log(torch.tensor([[0.5, 0.5], [0.2, 0.4]]))
    >>> loss, stats = RegretPOLoss(deterministic=True)(logps, logps, torch.ones(2, 2))
    >>> round(float(loss), 4), round(stats["reward_margin"], 4)
    (1.3667, 0.0396)

Reference: S. Kim, T. Cho et al., "A Regret Minimization Framework on Preference Learning in Large Language
Models", ICML 2026, arXiv:2606.09124 (loss as in the official code, ``RePO_Loss`` / ``RePO_Loss_deterministic``).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

NORMALIZATIONS = ("mean", "sum")
#: how the chosen-NLL term is averaged: over every chosen token of the batch (TRL, official) or per response
NLL_POOLINGS = ("token", "sequence")


def _check(name: str, x: Tensor, shape: torch.Size | None = None) -> None:
    if not isinstance(x, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.ndim != 2:
        raise ValueError(f"{name} must be (2B, T), got shape {tuple(x.shape)}")
    if shape is not None and x.shape != shape:
        raise ValueError(f"{name} has shape {tuple(x.shape)}, expected {tuple(shape)} like policy_logps")
    if not torch.isfinite(x).all():
        raise ValueError(f"{name} has NaN or Inf entries")


def tail_term(policy_logps: Tensor, behavior_logps: Tensor, mask: Tensor) -> Tensor:
    """k_t = mean over s >= t (valid tokens only) of (b_s - l_s): a reverse cumulative mean."""
    return reverse_mean(behavior_logps - policy_logps, mask)


TAIL_EPS = 1e-9  # the official estimate_kl_divergence_batchwise's eps


def topk_kl(policy_topk_logps: Tensor, behavior_topk_logps: Tensor, tail: bool = True) -> Tensor:
    """d_s: KL(mu || pi) per position from mu's top-k tokens plus the official uniform tail for the rest.

    d_s = sum_{v in V_s} mu(v) (log mu(v) - log pi(v)) + m_mu (log m_mu - log m_pi), where m = 1 - (top-k mass)
    + 1e-9 is each policy's mass outside V_s (spread uniformly over the other V - k tokens, which cancels).

    Args:
        policy_topk_logps: (2B, T, k) log pi_theta at the behaviour policy's top-k token ids.
        behavior_topk_logps: (2B, T, k) the behaviour policy's log-probs of those tokens.
        tail: add the uniform-tail term (official); ``False`` keeps the top-k part only.

    Returns:
        (2B, T) the per-position estimate.

    Example:
        >>> import torch
        >>> mu, pi = torch.log(torch.tensor([[[0.5, 0.3]]])), torch.log(torch.tensor([[[0.4, 0.4]]]))
        >>> round(float(topk_kl(pi, mu)), 6)  # 0.5 ln(0.5/0.4) + 0.3 ln(0.3/0.4) + 0.2 ln(0.2/0.2)
        0.025267
    """
    mu = behavior_topk_logps.exp()
    # $$d_s = \sum_{v \in V_s} \mu_s(v)\,(\log\mu_s(v) - \log\pi_{\theta,s}(v))$$
    top = (mu * (behavior_topk_logps - policy_topk_logps)).sum(-1)
    if not tail:
        return top
    # $$m^{\mu}_s = 1 - \sum_{v \in V_s}\mu_s(v) + \epsilon,\quad m^{\pi}_s = 1 - \sum_{v \in V_s}\pi_s(v) + \epsilon$$
    m_mu = (1.0 - mu.sum(-1).clamp(max=1.0)).clamp(min=0.0) + TAIL_EPS
    m_pi = (1.0 - policy_topk_logps.exp().sum(-1).clamp(max=1.0)).clamp(min=0.0) + TAIL_EPS
    # $$d_s \mathrel{+}= m^{\mu}_s\,(\log m^{\mu}_s - \log m^{\pi}_s)$$  (uniform tail over the other V - k tokens)
    return top + m_mu * (torch.log(m_mu) - torch.log(m_pi))


def reverse_mean(values: Tensor, mask: Tensor) -> Tensor:
    """k_t = (1 / (T - t + 1)) sum_{s >= t} values_s over valid tokens (zeros at padding)."""
    diff = values * mask
    # $$k_t = \frac{1}{T - t + 1} \sum_{s=t}^{T} (b_s - \ell_s)$$
    rev_sum = diff.flip(-1).cumsum(-1).flip(-1)
    remaining = mask.flip(-1).cumsum(-1).flip(-1)
    return torch.where(mask > 0, rev_sum / remaining.clamp(min=1), torch.zeros_like(rev_sum))


def sequence_score(
    policy_logps: Tensor,
    mask: Tensor,
    behavior_logps: Tensor | None,
    normalization: str = "mean",
    per_token_kl: Tensor | None = None,
) -> Tensor:
    """S(y) = normalise_t (l_t - k_t); with ``behavior_logps=None`` the plain normalised log-probability.

    ``per_token_kl`` (RePO-top-k's d_s, see ``topk_kl``) replaces the one-sample b_s - l_s in the tail term.
    """
    if per_token_kl is not None:
        per_token = policy_logps - reverse_mean(per_token_kl, mask)
    elif behavior_logps is None:
        per_token = policy_logps
    else:
        per_token = policy_logps - tail_term(policy_logps, behavior_logps, mask)
    total = (per_token * mask).sum(-1)
    if normalization == "sum":
        return total
    # $$S(y) = \frac{1}{T} \sum_t r_t$$
    return total / mask.sum(-1).clamp(min=1)


class RegretPOLoss(nn.Module):
    """RePO / RePO_det as a module: ``loss, stats = RegretPOLoss()(policy, ref, mask, behavior)``.

    Args:
        alpha: scale of the score difference (official 0.1).
        cpl_lambda: lambda, the conservative coefficient on the rejected score only (official 1).
        ref_coef: c_ref, weight of the reference score (official 1).
        sft_coef: c_sft, weight of the chosen response's NLL (official 1.0; the trainer's RPO-style term).
        normalization: ``"mean"`` (official) or ``"sum"`` over completion tokens.
        deterministic: RePO_det, b_t = 0 (needs no behaviour log-probs).
        topk: RePO-top-k, the tail term from the KL(mu || pi_theta) over mu's top-k tokens (needs
            ``policy_topk_logps`` and ``behavior_topk_logps`` in ``forward``).
        topk_tail: RePO-top-k adds the official uniform-tail term for the mass outside the top k (``topk_kl``).
        nll_pooling: ``"token"`` (official ``GPTLMLoss``, TRL's ``sft``) or ``"sequence"`` (``chosen_nll``).
    """

    def __init__(
        self,
        alpha: float = 0.1,
        cpl_lambda: float = 1.0,
        ref_coef: float = 1.0,
        sft_coef: float = 1.0,
        normalization: str = "mean",
        deterministic: bool = False,
        topk: bool = False,
        topk_tail: bool = True,
        nll_pooling: str = "token",
    ):
        super().__init__()
        if nll_pooling not in NLL_POOLINGS:
            raise ValueError(f"nll_pooling must be one of {NLL_POOLINGS}, got {nll_pooling!r}")
        if deterministic and topk:
            raise ValueError("deterministic and topk are exclusive variants; set at most one")
        for name, value in (
            ("alpha", alpha),
            ("cpl_lambda", cpl_lambda),
            ("ref_coef", ref_coef),
            ("sft_coef", sft_coef),
        ):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ValueError(f"{name} must be a finite number, got {value!r}")
        if alpha <= 0:
            raise ValueError(f"alpha must be > 0, got {alpha}")
        if sft_coef < 0:
            raise ValueError(f"sft_coef must be >= 0, got {sft_coef}")
        if normalization not in NORMALIZATIONS:
            raise ValueError(f"normalization must be one of {NORMALIZATIONS}, got {normalization!r}")
        self.alpha, self.cpl_lambda, self.ref_coef, self.sft_coef = alpha, cpl_lambda, ref_coef, sft_coef
        self.normalization, self.deterministic, self.topk = normalization, deterministic, topk
        self.topk_tail, self.nll_pooling = topk_tail, nll_pooling

    def forward(
        self,
        policy_logps: Tensor,
        ref_logps: Tensor,
        mask: Tensor,
        behavior_logps: Tensor | None = None,
        *,
        policy_topk_logps: Tensor | None = None,
        behavior_topk_logps: Tensor | None = None,
    ) -> tuple[Tensor, dict[str, float]]:
        """Mean loss over the B pairs, and statistics (rewards, margin, accuracy, NLL).

        Args:
            policy_logps, ref_logps: (2B, T) per-token log-probs, rows [chosen; rejected].
            mask: (2B, T), 1 on completion tokens.
            behavior_logps: (2B, T) log-probs under the policy that generated each response (required unless
                ``deterministic`` or ``topk``).
            policy_topk_logps, behavior_topk_logps: (2B, T, k) log pi_theta and log mu at mu's top-k token ids
                (``topk`` only).
        """
        _check("policy_logps", policy_logps)
        _check("ref_logps", ref_logps, policy_logps.shape)
        _check("mask", mask, policy_logps.shape)
        if policy_logps.shape[0] % 2:
            raise ValueError("policy_logps needs an even number of rows: [chosen; rejected]")
        lengths = mask.sum(-1)
        if (lengths == 0).any():
            raise ValueError(
                f"empty responses (no completion token) in rows {torch.nonzero(lengths == 0).ravel().tolist()}"
            )
        mask = mask.to(policy_logps.dtype)
        kl = None
        if self.topk:
            for name, x in (
                ("policy_topk_logps", policy_topk_logps),
                ("behavior_topk_logps", behavior_topk_logps),
            ):
                if x is None:
                    raise ValueError(f"RePO-top-k needs {name} (2B, T, k)")
                if not isinstance(x, Tensor):
                    raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
                if x.ndim != 3 or x.shape[:2] != policy_logps.shape:
                    raise ValueError(
                        f"{name} must be (2B, T, k) with (2B, T) = {tuple(policy_logps.shape)}, "
                        f"got {tuple(x.shape)}"
                    )
                if not torch.isfinite(x).all():
                    raise ValueError(f"{name} has NaN or Inf entries")
            if policy_topk_logps.shape != behavior_topk_logps.shape:
                raise ValueError(
                    f"policy_topk_logps {tuple(policy_topk_logps.shape)} and behavior_topk_logps "
                    f"{tuple(behavior_topk_logps.shape)} differ in shape"
                )
            kl = topk_kl(
                policy_topk_logps, behavior_topk_logps.to(policy_topk_logps.dtype), tail=self.topk_tail
            ).to(policy_logps.dtype)
            behavior = None
        elif self.deterministic:
            # RePO_det: the generation log-prob is taken as log 1 = 0
            behavior = torch.zeros_like(policy_logps)
        else:
            if behavior_logps is None:
                raise ValueError(
                    "RePO needs behavior_logps (the log-probs of the policy that generated each "
                    "response); use deterministic=True for plain preference pairs"
                )
            _check("behavior_logps", behavior_logps, policy_logps.shape)
            behavior = behavior_logps.to(policy_logps.dtype)
        score = sequence_score(policy_logps, mask, behavior, self.normalization, per_token_kl=kl)
        ref_score = sequence_score(ref_logps.to(policy_logps.dtype), mask, None, self.normalization)
        # $$R(y) = \alpha\,(S_\theta(y) - c_{ref} S_{ref}(y))$$
        reward = self.alpha * (score - self.ref_coef * ref_score)
        chosen, rejected = reward.chunk(2)
        # $$\mathcal{L} = -\log\sigma(R(y_w) - \lambda R(y_l)) + c_{sft}\,\mathrm{NLL}(y_w)$$
        pref = -F.logsigmoid(chosen - self.cpl_lambda * rejected)
        nll = chosen_nll(policy_logps, mask, self.nll_pooling)
        loss = (pref + self.sft_coef * nll).mean()
        stats = {
            "rewards_chosen": float(chosen.mean().detach()),
            "rewards_rejected": float(rejected.mean().detach()),
            "reward_margin": float((chosen - rejected).mean().detach()),
            "reward_accuracy": float((chosen > rejected).float().mean()),
            "nll": float(nll.mean().detach()),
        }
        return loss, stats


# -------------------------------------------------------------------------------- the baselines' pair losses
def dpo_loss(
    policy_logps: Tensor,
    ref_logps: Tensor,
    mask: Tensor,
    beta: float = 0.1,
    sft_coef: float = 0.0,
    nll_pooling: str = "token",
) -> Tensor:
    """DPO (Rafailov et al. 2023): -log sigmoid(beta [(log pi - log ref)(y_w) - (log pi - log ref)(y_l)]);
    ``sft_coef > 0`` adds the chosen NLL: RPO (Pang et al. 2024), TRL's ``loss_type=["sigmoid", "sft"]`` with
    ``loss_weights=[1, sft_coef]`` when ``nll_pooling="token"`` (``chosen_nll``)."""
    ratio = ((policy_logps - ref_logps) * mask).sum(-1)
    win, lose = ratio.chunk(2)
    loss = -F.logsigmoid(beta * (win - lose))
    if sft_coef:
        loss = loss + sft_coef * chosen_nll(policy_logps, mask, nll_pooling)
    return loss.mean()


def chosen_nll(policy_logps: Tensor, mask: Tensor, pooling: str = "token") -> Tensor:
    """The chosen responses' NLL (the RPO / RePO ``c_sft`` term), shape (B,); its mean is the batch's term.

    ``pooling="token"`` (TRL's ``loss_type="sft"``, the official trainer's ``GPTLMLoss``): one mean over every
    chosen token of the batch, repeated B times, so a long response weighs by its length;
    ``"sequence"``: each response's own mean token NLL (every response weighs the same).

    Example:
        >>> import torch
        >>> lp = torch.tensor([[-1.0, 0.0], [-2.0, -4.0], [0.0, 0.0], [0.0, 0.0]])
        >>> m = torch.tensor([[1.0, 0.0], [1.0, 1.0], [1.0, 0.0], [1.0, 1.0]])
        >>> chosen_nll(lp, m).tolist(), chosen_nll(lp, m, "sequence").tolist()
        ([2.3333332538604736, 2.3333332538604736], [1.0, 3.0])
    """
    if pooling not in NLL_POOLINGS:
        raise ValueError(f"pooling must be one of {NLL_POOLINGS}, got {pooling!r}")
    c_logps, _ = policy_logps.chunk(2)
    c_mask, _ = mask.chunk(2)
    if pooling == "token":
        # $$\mathrm{NLL} = -\sum_{i,t} m_{it}\,\ell_{it} / \sum_{i,t} m_{it}$$  (TRL "sft": pooled over tokens)
        return (-(c_logps * c_mask).sum() / c_mask.sum()).expand(c_logps.shape[0])
    # $$\mathrm{NLL}_i = -\sum_t m_{it}\,\ell_{it} / \sum_t m_{it}$$  (per sequence)
    return -(c_logps * c_mask).sum(-1) / c_mask.sum(-1)


def ipo_loss(
    policy_logps: Tensor,
    ref_logps: Tensor,
    mask: Tensor,
    beta: float = 0.1,
    sft_coef: float = 0.0,
    nll_pooling: str = "token",
) -> Tensor:
    """IPO (Azar et al. 2024) with TRL's length normalisation: (h_w - h_l - 1 / (2 beta))^2, h = mean log ratio;
    ``sft_coef > 0`` adds the chosen NLL."""
    h = ((policy_logps - ref_logps) * mask).sum(-1) / mask.sum(-1)
    win, lose = h.chunk(2)
    loss = (win - lose - 1.0 / (2.0 * beta)) ** 2
    if sft_coef:
        loss = loss + sft_coef * chosen_nll(policy_logps, mask, nll_pooling)
    return loss.mean()


def simpo_loss(
    policy_logps: Tensor,
    mask: Tensor,
    beta: float = 2.0,
    gamma: float = 1.0,
    sft_coef: float = 0.0,
    nll_pooling: str = "token",
) -> Tensor:
    """SimPO (Meng et al. 2024): -log sigmoid(beta (mean log pi(y_w) - mean log pi(y_l)) - gamma), no reference;
    ``sft_coef > 0`` adds the chosen NLL."""
    s = (policy_logps * mask).sum(-1) / mask.sum(-1)
    win, lose = s.chunk(2)
    loss = -F.logsigmoid(beta * (win - lose) - gamma)
    if sft_coef:
        loss = loss + sft_coef * chosen_nll(policy_logps, mask, nll_pooling)
    return loss.mean()
