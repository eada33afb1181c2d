"""PS-PPO in TRL: ``PSGRPOTrainer``, a ``trl.GRPOTrainer`` whose update runs on sampled prefixes only.

Generation, rewards and group advantages are TRL's; in the update, each completion gets one cutoff c_i from the
configured law, the forward/backward pass runs on the prompt plus the completion sliced to the batch's largest
cutoff, tokens after their own cutoff are masked, and every kept token is weighted by 1 / P(c >= t) with the
constant Dr.GRPO normaliser, so the gradient is unbiased for the full-trajectory objective.

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
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from trl import GRPOConfig, GRPOTrainer

from .estimator import GeometricCutoff, MixtureCutoff, UniformCutoff, prefix_sampled_policy_loss


@dataclass
class PSGRPOConfig(GRPOConfig):
    """``GRPOConfig`` plus the cutoff law; the loss type is forced to the constant-normalised ``dr_grpo``."""

    cutoff: str = field(default="uniform", metadata={"help": "'uniform', 'geometric' or 'mixed' (uniform + geometric)"})
    cutoff_p: float = field(default=0.1, metadata={"help": "p of the geometric law"})
    cutoff_mix: float = field(default=0.5, metadata={"help": "weight of the uniform part of 'mixed'"})
    cutoff_seed: int = field(default=0, metadata={"help": "seed of the cutoff draws"})

    def __post_init__(self) -> None:
        self.loss_type = "dr_grpo"
        super().__post_init__()


def cutoff_law(name: str, p: float = 0.1, mix: float = 0.5) -> Any:
    """The cutoff distribution named by a config."""
    if name == "uniform":
        return UniformCutoff()
    if name == "geometric":
        return GeometricCutoff(p)
    if name == "mixed":
        return MixtureCutoff([UniformCutoff(), GeometricCutoff(p)], [mix, 1.0 - mix])
    raise ValueError(f"cutoff must be 'uniform', 'geometric' or 'mixed', got {name!r}")


class PSGRPOTrainer(GRPOTrainer):
    """``GRPOTrainer`` with the prefix-sampled, importance-weighted loss (``prefix_sampled_policy_loss``).

    Logged metrics: ``ps/kept_token_fraction`` and ``ps/max_weight`` next to TRL's.
    """

    def __init__(self, *args: Any, **kwargs: Any):
        config = kwargs.get("args")
        if not isinstance(config, PSGRPOConfig):
            raise TypeError(f"args must be a PSGRPOConfig, got {type(config).__name__}")
        if config.beta != 0.0:
            raise ValueError("PS-PPO here is critic-free without the KL term: set beta=0.0")
        self.cutoff = cutoff_law(config.cutoff, config.cutoff_p, config.cutoff_mix)
        self._cutoff_generator = torch.Generator().manual_seed(config.cutoff_seed)
        super().__init__(*args, **kwargs)

    def _compute_loss(self, model: Any, inputs: dict[str, Any]) -> torch.Tensor:
        prompt_ids, prompt_mask = inputs["prompt_ids"], inputs["prompt_mask"]
        completion_ids, completion_mask = inputs["completion_ids"], inputs["completion_mask"]
        lengths = completion_mask.sum(1).long()
        has_tokens = lengths > 0
        safe_lengths = lengths.clamp(min=1)  # empty completions keep no token (their mask is all zero)
        cutoffs = self.cutoff.sample(safe_lengths, generator=self._cutoff_generator).to(completion_ids.device)
        keep = int(cutoffs[has_tokens].max()) if has_tokens.any() else 1
        # the update runs on the prompt and the first `keep` completion tokens only (causal LM: exact log-probs)
        input_ids = torch.cat([prompt_ids, completion_ids[:, :keep]], dim=1)
        attention_mask = torch.cat([prompt_mask, completion_mask[:, :keep]], dim=1)
        logps, _, _ = self._get_per_token_logps_and_entropies(model, input_ids, attention_mask, keep)
        old = inputs.get("old_per_token_logps")
        old = logps.detach() if old is None else old[:, :keep]
        survival = self.cutoff.survival(safe_lengths, keep).to(logps.device)
        mask = completion_mask[:, :keep] * has_tokens[:, None]
        loss, stats = prefix_sampled_policy_loss(logps, old, inputs["advantages"], mask, cutoffs, survival,
                                                 clip_eps=self.epsilon_low, max_len=self.max_completion_length)
        mode = "train" if self.model.training else "eval"
        self._metrics[mode]["ps/kept_token_fraction"].append(stats["kept_tokens"] / max(1.0, float(lengths.sum())))
        self._metrics[mode]["ps/max_weight"].append(stats["max_weight"])
        if mode == "train":
            loss = loss / self.current_gradient_accumulation_steps
        return loss
