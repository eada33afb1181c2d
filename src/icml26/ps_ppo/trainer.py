"""PS-PPO in TRL: ``PSGRPOTrainer``, a ``trl.GRPOTrainer`` whose update runs on sampled prefixes only.

Generation, rewards and group advantages are TRL's. In the update, each completion gets one cutoff c_i from the
configured law (stratified within each prompt's group of rollouts by default; a ``PromptConditionedCutoff`` or
any law object may be passed as ``cutoff=``, and receives the decoded prompt text as each row's key; an
``AdaptiveCutoff``, the prompt-conditioned law of the reproduction's headline arm, is fed each prompt's rollouts and
advantages before its cutoffs are drawn); rows are
split into ``ps_micro_batches`` token-balanced micro-batches (``microbatch.plan_micro_batches``, the code the
reproduction runs), each micro-batch runs forward and backward on the prompt plus its own longest kept prefix,
tokens after their own cutoff are masked, and every kept token is weighted by 1 / P(c >= t) with the constant
Dr.GRPO normaliser, so the gradient is unbiased for the full-trajectory objective:

    J = 1 / (B * L_max) * sum_i sum_{t <= c_i} min(rho_t A_i, clip(rho_t, 1 - eps, 1 + eps) A_i) / P(c_i >= t)

With ``num_iterations > 1`` TRL supplies the sampling policy's log-probs and the clip acts.

Example (offline, a tiny model saved to a temporary directory):
    >>> import contextlib, io, tempfile, datasets
    >>> from icml26.common.tiny_lm import char_tokenizer, save_lab_model, tiny_causal_lm
    >>> tok = char_tokenizer(); path = save_lab_model(tiny_causal_lm(len(tok), seed=0), tok, tempfile.mkdtemp())
    >>> data = datasets.Dataset.from_dict({"prompt": ["1+2=", "3+4="] * 4})
    >>> args = PSGRPOConfig(output_dir=tempfile.mkdtemp(), cutoff="uniform", max_steps=1, num_generations=4,
    ...                     per_device_train_batch_size=4, max_completion_length=6, report_to="none", use_cpu=True)
    >>> trainer = PSGRPOTrainer(str(path), reward_funcs=lambda completions, **kw: [float(len(c)) for c in completions],
    ...                         args=args, train_dataset=data, processing_class=tok)
    >>> with contextlib.redirect_stdout(io.StringIO()):
    ...     result = trainer.train()
    >>> result.global_step
    1

Reference: reconstruction of PS-PPO (Hwang & Kim, ICML 2026, arXiv:2606.29758) from its abstract.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from trl import GRPOConfig, GRPOTrainer

from .estimator import (
    AdaptiveCutoff,
    GeometricCutoff,
    MixtureCutoff,
    UniformCutoff,
    prefix_sampled_policy_loss,
)
from .microbatch import FullCutoff, StratifiedCutoff, micro_batched_backward


@dataclass
class PSGRPOConfig(GRPOConfig):
    """``GRPOConfig`` plus the cutoff law; the loss type is forced to the constant-normalised ``dr_grpo``."""

    cutoff: str = field(
        default="uniform",
        metadata={
            "help": "'uniform', 'geometric', 'mixed' (uniform + geometric) or 'full_mixed' (full trajectory + uniform)"
        },
    )
    cutoff_p: float = field(default=0.1, metadata={"help": "p of the geometric law"})
    cutoff_mix: float = field(
        default=0.5,
        metadata={
            "help": "weight of the uniform part of 'mixed'; weight of the full-trajectory part of 'full_mixed'"
        },
    )
    cutoff_stratified: bool = field(
        default=True,
        metadata={
            "help": "stratify the cutoffs within each prompt's rollouts (same marginal law, lower variance)"
        },
    )
    cutoff_seed: int = field(default=0, metadata={"help": "seed of the cutoff draws"})
    ps_micro_batches: int = field(
        default=4,
        metadata={
            "help": "token-balanced micro-batches per update step (forward + backward one at a time); the default 4 "
            "is where the prefix saving shows: one pass pads every row to the batch's longest kept prefix, which "
            "is nearly the full width (see the micro-batching rows of benchmarks/ps_ppo.py)"
        },
    )

    def __post_init__(self) -> None:
        self.loss_type = "dr_grpo"
        super().__post_init__()


def cutoff_law(name: str, p: float = 0.1, mix: float = 0.5, stratified: bool = False) -> Any:
    """The cutoff distribution named by a config."""
    if name == "uniform":
        law: Any = UniformCutoff()
    elif name == "geometric":
        law = GeometricCutoff(p)
    elif name == "mixed":
        law = MixtureCutoff([UniformCutoff(), GeometricCutoff(p)], [mix, 1.0 - mix])
    elif name == "full_mixed":
        law = MixtureCutoff([FullCutoff(), UniformCutoff()], [mix, 1.0 - mix])
    else:
        raise ValueError(f"cutoff must be 'uniform', 'geometric', 'mixed' or 'full_mixed', got {name!r}")
    return StratifiedCutoff(law) if stratified else law


def _no_backward(loss: torch.Tensor) -> None:
    """Evaluation: no gradient."""


class PSGRPOTrainer(GRPOTrainer):
    """``GRPOTrainer`` with the prefix-sampled, importance-weighted loss (``prefix_sampled_policy_loss``).

    Args:
        *args, **kwargs: as ``trl.GRPOTrainer``; ``args`` must be a ``PSGRPOConfig`` with ``beta=0.0``.
        cutoff: optional law object (``sample(lengths, generator, keys)``, ``survival(lengths, T, keys)``), e.g.
            a ``PromptConditionedCutoff``; its keys are the decoded prompts. Overrides ``args.cutoff``.

    Logged metrics: ``ps/kept_token_fraction``, ``ps/update_positions`` and ``ps/max_weight`` next to TRL's.
    """

    def __init__(self, *args: Any, cutoff: Any = None, **kwargs: Any):
        config = kwargs.get("args")
        if not isinstance(config, PSGRPOConfig):
            raise TypeError(f"args must be a PSGRPOConfig, got {type(config).__name__}")
        if config.beta != 0.0:
            raise ValueError("PS-PPO here is critic-free without the KL term: set beta=0.0")
        if not isinstance(config.ps_micro_batches, int) or config.ps_micro_batches < 1:
            raise ValueError(f"ps_micro_batches must be a positive integer, got {config.ps_micro_batches!r}")
        if cutoff is not None and not (hasattr(cutoff, "sample") and hasattr(cutoff, "survival")):
            raise TypeError(f"cutoff must be a law with sample() and survival(), got {type(cutoff).__name__}")
        self.cutoff = (
            cutoff
            if cutoff is not None
            else cutoff_law(config.cutoff, config.cutoff_p, config.cutoff_mix, config.cutoff_stratified)
        )
        self._cutoff_generator = torch.Generator().manual_seed(config.cutoff_seed)
        super().__init__(*args, **kwargs)

    def _prompt_keys(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor) -> list[str]:
        rows = [ids[m.bool()].tolist() for ids, m in zip(prompt_ids, prompt_mask, strict=True)]
        return self.processing_class.batch_decode(rows, skip_special_tokens=True)

    def _observe(
        self, keys: list[str], completion_ids: torch.Tensor, completion_mask: torch.Tensor, advantages: torch.Tensor
    ) -> None:
        """Feed a prompt-conditioned ``AdaptiveCutoff`` (possibly inside ``StratifiedCutoff``) each prompt's
        rollouts before its cutoffs are drawn: rollouts with a positive group advantage count as correct, the others
        as incorrect (for 0/1 rewards, exactly the correct ones of a mixed group), as the reproduction does with its
        rewards. The law then depends on the batch, not on the update, so the weights keep the update unbiased."""
        base = getattr(self.cutoff, "base", self.cutoff)
        if not isinstance(base, AdaptiveCutoff):
            return
        score = advantages if advantages.ndim == 1 else advantages[:, 0]
        groups: dict[str, list[int]] = {}
        for i, key in enumerate(keys):
            groups.setdefault(key, []).append(i)
        for key, rows in groups.items():
            base.update(
                key,
                [completion_ids[i][completion_mask[i] > 0].tolist() for i in rows],
                [float(score[i]) for i in rows],
            )

    def _compute_loss(self, model: Any, inputs: dict[str, Any]) -> torch.Tensor:
        prompt_ids, prompt_mask = inputs["prompt_ids"], inputs["prompt_mask"]
        completion_ids, completion_mask = inputs["completion_ids"], inputs["completion_mask"]
        lengths = completion_mask.sum(1).long()
        has_tokens = lengths > 0
        safe_lengths = lengths.clamp(min=1).cpu()  # empty completions keep no token (their mask is all zero)
        keys = self._prompt_keys(prompt_ids, prompt_mask)
        if self.model.training:
            self._observe(keys, completion_ids, completion_mask, inputs["advantages"])
        cutoffs = self.cutoff.sample(safe_lengths, generator=self._cutoff_generator, keys=keys)
        survival_all = self.cutoff.survival(safe_lengths, int(safe_lengths.max()), keys=keys)
        cutoffs = cutoffs.to(completion_ids.device)
        B, P = prompt_ids.shape
        old_all = inputs.get("old_per_token_logps")
        training = self.model.training and torch.is_grad_enabled()
        scale = 1.0 / self.current_gradient_accumulation_steps if self.model.training else 1.0
        record = {"kept": 0.0, "max_weight": 0.0}

        def loss_of(rows: torch.Tensor, width: int) -> torch.Tensor:
            keep = width - P  # this micro-batch's longest kept completion prefix
            rows = rows.to(completion_ids.device)
            # the forward runs on the prompt and the first `keep` completion tokens only (causal LM: exact)
            input_ids = torch.cat([prompt_ids[rows], completion_ids[rows, :keep]], dim=1)
            attention_mask = torch.cat([prompt_mask[rows], completion_mask[rows, :keep]], dim=1)
            logps, _, _ = self._get_per_token_logps_and_entropies(model, input_ids, attention_mask, keep)
            old = logps.detach() if old_all is None else old_all[rows, :keep]
            survival = survival_all[rows.cpu(), :keep].to(logps.device, logps.dtype)
            mask = completion_mask[rows, :keep] * has_tokens[rows, None]
            adv = inputs["advantages"][rows]
            loss, stats = prefix_sampled_policy_loss(
                logps,
                old,
                adv,
                mask,
                cutoffs[rows],
                survival,
                clip_eps=self.epsilon_low,
                max_len=self.max_completion_length,
            )
            record["kept"] += stats["kept_tokens"]
            record["max_weight"] = max(record["max_weight"], stats["max_weight"])
            return (
                loss * len(rows) / B * scale
            )  # each micro-batch's share of the constant normaliser B * L_max

        keep_len = (P + cutoffs.where(has_tokens, torch.ones_like(cutoffs))).cpu()
        stats = micro_batched_backward(
            keep_len,
            self.args.ps_micro_batches,
            loss_of,
            model=model,
            backward=self.accelerator.backward if training else _no_backward,
        )
        mode = "train" if self.model.training else "eval"
        self._metrics[mode]["ps/kept_token_fraction"].append(record["kept"] / max(1.0, float(lengths.sum())))
        self._metrics[mode]["ps/update_positions"].append(float(stats.tokens))
        self._metrics[mode]["ps/max_weight"].append(record["max_weight"])
        # the gradients are already accumulated micro-batch by micro-batch; the returned loss carries the value
        # for logging and backpropagates into nothing
        loss = torch.tensor(stats.loss, device=completion_ids.device)
        return loss.requires_grad_() if training else loss
