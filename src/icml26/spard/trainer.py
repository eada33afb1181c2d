"""SPAG in TRL: ``SafetyProjectedTrainer``, a ``trl.SFTTrainer`` that follows each utility update with a safety step.

After every optimizer step of ordinary SFT (gradient accumulation, clipping and the optimizer as configured),
the trainer draws ``safe_accumulation_steps`` micro-batches of ``safe_batch_size`` examples from an endless
iterator over ``safe_dataset``, accumulates the safety loss L_s (token-mean NLL of the safe completions) and
its gradient, and — only if ``L_s > safe_tau + safe_tolerance`` — applies the SPAG safety step of
:func:`icml26.spard.core.spag_safety_update`:

- ``spag_mode="official"`` (default, the released code): clip the safety gradient to ``max_grad_norm``, rescale
  each parameter tensor's gradient by ``min((L_s - tau) / (||g_p|| + 1e-8), alpha_max)`` and step the *same*
  optimizer (its moments are shared with the utility steps);
- ``spag_mode="polyak"`` (the README's closed-form projection): ``theta <- theta - min((L_s - tau) / ||g||^2,
  alpha_max) * g`` on the unclipped global gradient, no optimizer.

The learning-rate scheduler and ``global_step`` advance once per (utility, safety) pair, as in the released
code. The safety step runs from a ``TrainerCallback.on_optimizer_step`` hook, so TRL's own loop, LoRA through
``peft_config``, Accelerate and logging stay untouched. Logged: ``spag/safety_loss``, ``spag/triggered``,
``spag/loss_probe`` (the safety loss on the last safety micro-batch right after a fired step); the released
code's ``tau_trigger`` and ``loss_probe`` lists are kept on the trainer.

L_s is over the safe *responses* only. A conversational safe dataset (a ``messages`` column of
``{"role", "content"}`` dicts) is split into TRL's conversational prompt-completion form, ``prompt`` =
``messages[:-1]`` and ``completion`` = ``messages[-1:]`` (which must be an assistant turn), so TRL masks the
harmful prompt out of the labels; otherwise L_s would include the prompt tokens and ``safe_tau`` would be on another
scale than the paper's. With ``assistant_only_loss=True`` the dataset is left as is (TRL masks all but the
assistant turns); with ``completion_only_loss=False`` the prompt tokens stay in L_s and a ``UserWarning`` says so.

Safety data must not contain an evaluation prompt: pass ``held_out_prompts`` (or an ``eval_dataset`` with a
``prompt`` column) and the trainer refuses overlapping safety data with a ``ValueError``.

Example (offline, a tiny model, one step):
    >>> import contextlib, io, tempfile, datasets
    >>> from icml26.common.tiny_lm import char_tokenizer, tiny_causal_lm
    >>> tok = char_tokenizer(); model = tiny_causal_lm(len(tok), seed=0)
    >>> train = datasets.Dataset.from_dict({"prompt": ["12+30=", "41+17="], "completion": ["42", "58"]})
    >>> safe = datasets.Dataset.from_dict({"prompt": ["how do i make poison:"],
    ...                                    "completion": ["no, i cannot help."]})
    >>> args = SPAGConfig(output_dir=tempfile.mkdtemp(), max_steps=1, per_device_train_batch_size=2,
    ...                   safe_tau=0.2, safe_tolerance=0.1, report_to="none", use_cpu=True, disable_tqdm=True)
    >>> trainer = SafetyProjectedTrainer(model, args=args, train_dataset=train, safe_dataset=safe,
    ...                                  processing_class=tok)
    >>> with contextlib.redirect_stdout(io.StringIO()):
    ...     _ = trainer.train()
    >>> trainer.tau_trigger                        # the random model's safety loss is far above tau + delta
    [1]

Reference: S. Chen et al., "SPARD: Defending Harmful Fine-Tuning Attack via Safety Projection with
Relevance-Diversity Data Selection", ICML 2026; ``utils/SPAGOptimizerTrainer.py`` of github.com/shuhao02/SPARD.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import TrainerCallback
from trl import SFTConfig, SFTTrainer
from trl.data_utils import is_conversational

from .core import MODES, check_spag_args, spag_safety_update


@dataclass
class SPAGConfig(SFTConfig):
    """``SFTConfig`` plus SPAG's safety phase (defaults: the paper's README)."""

    safe_tau: float = field(default=0.2, metadata={"help": "safety-loss threshold tau (> 0)"})
    safe_tolerance: float = field(default=0.1, metadata={"help": "tolerance delta: the step fires if L_s > tau + delta"})
    alpha_max: float = field(default=1.0, metadata={"help": "cap on the per-tensor scale (official) or Polyak step"})
    safe_batch_size: int = field(default=1, metadata={"help": "examples per safety micro-batch (official: 1)"})
    safe_accumulation_steps: int | None = field(
        default=None, metadata={"help": "safety micro-batches per step (default: gradient_accumulation_steps)"})
    spag_mode: str = field(default="official", metadata={"help": "'official' (released code) or 'polyak'"})

    def __post_init__(self) -> None:
        super().__post_init__()
        check_spag_args(self.safe_tau, self.safe_tolerance, self.alpha_max, self.spag_mode)
        if isinstance(self.safe_batch_size, bool) or not isinstance(self.safe_batch_size, int) \
                or self.safe_batch_size < 1:
            raise ValueError(f"safe_batch_size must be an int >= 1, got {self.safe_batch_size!r}")
        if self.safe_accumulation_steps is not None and (
                not isinstance(self.safe_accumulation_steps, int) or self.safe_accumulation_steps < 1):
            raise ValueError(f"safe_accumulation_steps must be None or an int >= 1, got "
                             f"{self.safe_accumulation_steps!r}")


def _prompt_texts(prompt: Any) -> list[str]:
    """The prompt text(s) of one example: a string as it is; a conversation (a list of messages), the content of
    each message that is not the assistant's (what a user would have typed, and what an evaluation prompt is)."""
    if isinstance(prompt, str):
        return [prompt]
    if isinstance(prompt, (list, tuple)):
        return [m["content"] for m in prompt if isinstance(m, dict) and m.get("role") != "assistant"
                and isinstance(m.get("content"), str)]
    return [str(prompt)]


def _prompts_of(dataset: Any) -> list[str]:
    """Every prompt text of ``dataset``: its ``prompt`` column (standard or conversational) or, for a
    conversational ``messages`` dataset, the non-assistant turns (empty for any other format)."""
    columns = getattr(dataset, "column_names", ()) if dataset is not None else ()
    if "prompt" in columns:
        rows = dataset["prompt"]
    elif "messages" in columns:
        rows = dataset["messages"]
    else:
        return []
    return [text for row in rows for text in _prompt_texts(row)]


def check_disjoint(safe_prompts: Iterable[str], held_out_prompts: Iterable[str]) -> None:
    """Raise ``ValueError`` if any safety prompt is also a held-out (evaluation) prompt.

    Example:
        >>> check_disjoint(["a:", "b:"], ["c:"])
        >>> try:
        ...     check_disjoint(["a:", "b:"], ["b:"])
        ... except ValueError as exc:
        ...     print(str(exc)[:52])
        safe_dataset shares 1 prompt(s) with the held-out ev
    """
    held = set(held_out_prompts)
    shared = sorted({p for p in safe_prompts if p in held})
    if shared:
        raise ValueError(f"safe_dataset shares {len(shared)} prompt(s) with the held-out evaluation prompts "
                         f"(e.g. {shared[0]!r}); safety data must be disjoint from what is evaluated")


def _split_last_turn(example: dict[str, Any], index: int) -> dict[str, Any]:
    messages = example["messages"]
    if len(messages) < 2 or messages[-1].get("role") != "assistant":
        raise ValueError(f"safe_dataset example {index}: a conversational safety example must end with an "
                         f"assistant message after at least one prompt message, got roles "
                         f"{[m.get('role') for m in messages]}")
    return {"prompt": messages[:-1], "completion": messages[-1:]}


def safety_prompt_completion(dataset: Any, args: SFTConfig) -> Any:
    """A conversational (``messages``) safe dataset in TRL's prompt-completion form, so L_s skips the prompt.

    Any other dataset, or any dataset under ``assistant_only_loss=True`` (TRL masks to the assistant turns), is
    returned unchanged; under ``completion_only_loss=False`` too, with a ``UserWarning`` (L_s includes the prompt).
    Raises ``ValueError`` (naming the example) if a conversation does not end with an assistant message after at
    least one other message.
    """
    first = next(iter(dataset))
    if "messages" not in first or not is_conversational(first) or args.assistant_only_loss:
        return dataset
    if args.completion_only_loss is False:
        warnings.warn("completion_only_loss=False with a conversational safe_dataset: the safety loss L_s includes "
                      "the prompt tokens, so safe_tau is on a different scale than the paper's (response-only L_s)",
                      UserWarning, stacklevel=3)
        return dataset
    return dataset.map(_split_last_turn, with_indices=True, remove_columns=["messages"])


class _SafetyPhase(TrainerCallback):
    """Runs the trainer's safety phase right after each utility ``optimizer.step()``."""

    def __init__(self, trainer: SafetyProjectedTrainer):
        self.trainer = trainer

    def on_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.trainer.safety_phase()


class SafetyProjectedTrainer(SFTTrainer):
    """``SFTTrainer`` with SPAG's alternating safety step (module docstring).

    Args:
        model, args, train_dataset, processing_class, ...: as for ``trl.SFTTrainer``; ``args`` must be a
            :class:`SPAGConfig`.
        safe_dataset: the safety data (same format as ``train_dataset``, e.g. ``prompt``/``completion`` with
            refusals), prepared by TRL's own pipeline; a ``messages`` dataset is split into prompt (all but the
            last turn) and completion (the last, assistant turn) so that L_s covers the response only (module
            docstring).
        held_out_prompts: prompts that will be evaluated; safety data containing one is refused.

    Attributes:
        tau_trigger: one 0/1 per step (did the safety step fire), as in the released code.
        loss_probe: the post-step safety loss of each fired step.
        safety_losses: L_s of every step.
    """

    _tag_names = ("trl", "sft", "spag")

    def __init__(self, model: Any, args: SPAGConfig | None = None, *, safe_dataset: Any,
                 held_out_prompts: Iterable[str] | None = None, **kwargs: Any):
        if not isinstance(args, SPAGConfig):
            raise TypeError(f"args must be a SPAGConfig, got {type(args).__name__}")
        if args.spag_mode not in MODES:
            raise ValueError(f"spag_mode must be one of {MODES}, got {args.spag_mode!r}")
        if safe_dataset is None or len(safe_dataset) == 0:
            raise ValueError("safe_dataset must hold at least one example")
        held = set(held_out_prompts or ()) | set(_prompts_of(kwargs.get("eval_dataset")))
        if held:
            check_disjoint(_prompts_of(safe_dataset), held)
        super().__init__(model, args=args, **kwargs)
        if not self._skip_prepare_dataset:
            safe_dataset = safety_prompt_completion(safe_dataset, args)
            # TRL decides completion_only_loss=None from train_dataset's format; the safe data decides its own
            completion_only_loss = self.completion_only_loss
            if args.completion_only_loss is None:
                first = next(iter(safe_dataset))
                self.completion_only_loss = "prompt" in first and "completion" in first
            try:
                safe_dataset = self._prepare_dataset(safe_dataset, self.processing_class, self.args, False,
                                                     self._formatting_func, "safe")
            finally:
                self.completion_only_loss = completion_only_loss
        self.safe_dataset = safe_dataset
        self.tau_trigger: list[int] = []
        self.loss_probe: list[float] = []
        self.safety_losses: list[float] = []
        self._safe_iter: Iterator[Any] | None = None
        self.add_callback(_SafetyPhase(self))

    # -------------------------------------------------------------------------------------------- data
    def get_safe_dataloader(self) -> Any:
        """A shuffled dataloader over the safety data (``safe_batch_size`` per batch), through Accelerate."""
        return self._get_dataloader(self.safe_dataset, description="safe", batch_size=self.args.safe_batch_size,
                                    sampler_fn=self._get_train_sampler, is_training=True)

    def _next_safe_batch(self) -> dict[str, Any]:
        if self._safe_iter is None:
            self._safe_iter = iter(self.get_safe_dataloader())
        try:
            return next(self._safe_iter)
        except StopIteration:  # an endless iterator, as the released InfinityDataLoader
            self._safe_iter = iter(self.get_safe_dataloader())
            return next(self._safe_iter)

    # -------------------------------------------------------------------------------------------- safety phase
    @staticmethod
    def _token_nll(model: Any, inputs: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
        """Summed next-token NLL over the label tokens, and their count."""
        labels = inputs["labels"]
        kwargs = {k: v for k, v in inputs.items() if k in ("input_ids", "attention_mask", "position_ids")}
        logits = model(**kwargs, use_cache=False).logits[:, :-1].float()
        target = labels[:, 1:]
        nll = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), target.reshape(-1),
                                                ignore_index=-100, reduction="sum")
        return nll, (target != -100).sum()

    def safety_phase(self) -> dict[str, float]:
        """One SPAG safety phase on the current model (called after each utility optimizer step)."""
        args: SPAGConfig = self.args
        model = self.model_wrapped if self.model_wrapped is not None else self.model
        n_micro = args.safe_accumulation_steps or args.gradient_accumulation_steps
        batches = [self._prepare_inputs(self._next_safe_batch()) for _ in range(n_micro)]
        total_tokens = sum(int((b["labels"][:, 1:] != -100).sum()) for b in batches)
        if total_tokens == 0:
            raise ValueError("the safety batches have no label tokens (check the safe_dataset's completions)")
        model.zero_grad(set_to_none=True)
        model.train()
        safety_loss = 0.0
        for batch in batches:
            with self.compute_loss_context_manager():
                nll, _ = self._token_nll(model, batch)
                # L_s = token-mean NLL over all safety micro-batches (the released code sums the scaled losses)
                loss = nll / total_tokens
            self.accelerator.backward(loss)
            safety_loss += float(loss.detach())
        params = [p for p in model.parameters() if p.requires_grad]
        if args.spag_mode == "official" and args.max_grad_norm and args.max_grad_norm > 0:
            self.accelerator.clip_grad_norm_(params, args.max_grad_norm)
        info = spag_safety_update(params, safety_loss, tau=args.safe_tau, tolerance=args.safe_tolerance,
                                  eta_safe=args.alpha_max, mode=args.spag_mode, optimizer=self.optimizer)
        model.zero_grad(set_to_none=True)
        fired = int(info["triggered"])
        self.tau_trigger.append(fired)
        self.safety_losses.append(safety_loss)
        self._metrics["train"]["spag/safety_loss"].append(safety_loss)
        self._metrics["train"]["spag/triggered"].append(float(fired))
        if fired:
            with torch.no_grad():
                nll, count = self._token_nll(model, batches[-1])
            probe = float(nll / count.clamp(min=1))
            self.loss_probe.append(probe)
            self._metrics["train"]["spag/loss_probe"].append(probe)
        return {"safety_loss": safety_loss, **info}
