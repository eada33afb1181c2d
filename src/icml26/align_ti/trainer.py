"""``AlignTITrainer``: TRL's GKD trainer with Align-TI's objective, for LLaVA-style students and teachers.

TRL 1.16 keeps GKD under ``trl.experimental.gkd``; its ``compute_loss`` passes only ``input_ids`` and
``attention_mask`` to the models (no ``pixel_values``) and its loss is token-level only. This subclass keeps
everything else of ``GKDTrainer`` (teacher preparation in evaluation mode, the shared-vocabulary check, dropout
off, logging, saving) and overrides ``compute_loss`` with ``AlignTILoss`` over the full multimodal batch.
Align-TI trains on the ground-truth responses, so the on-policy options (``lmbda``, ``seq_kd``) must stay off, and
``GKDConfig``'s divergence settings must agree with the loss's (``temperature`` equal to
``AlignTILoss.temperature``; ``beta`` 0 for forward KL, 1 for reverse KL, TRL's generalised-JSD convention), else
the trainer refuses them rather than ignore them. ``predict``/``evaluate`` return the student's logits. IVA's
projection (``AlignTILoss.iva_projection``, trained with the student, not part of it) joins the optimiser as a
parameter group without weight decay (its gradients are zeroed after every optimiser step, as the student's are;
gradient clipping, ``max_grad_norm``, covers the student only); optimisers passed in must hold it already.
``VLMCollator`` pads the lab's per-example dicts (TRL trainers keep only the columns they know, so a VLM batch
needs its own collator).

Example (CPU, two steps on the lab's tiny models):
    >>> import contextlib, io, tempfile
    >>> import numpy as np
    >>> from trl.experimental.gkd import GKDConfig
    >>> from icml26.common.tiny_vlm import SceneSpec, VLMSpec, tiny_vlm, vlm_tokenizer
    >>> tok, scenes = vlm_tokenizer(), SceneSpec(grid=2)
    >>> teacher = tiny_vlm(tok, VLMSpec(hidden=32, layers=2), scenes, seed=0)
    >>> student = tiny_vlm(tok, VLMSpec(hidden=16, layers=1), scenes, seed=1)
    >>> data = lab_examples(tok, scenes, np.random.default_rng(0), 8, ("patch",))
    >>> args = GKDConfig(output_dir=tempfile.mkdtemp(), max_steps=2, per_device_train_batch_size=4,
    ...                  report_to=[], lmbda=0.0, temperature=1.0, beta=0.0, use_cpu=True, save_strategy="no",
    ...                  disable_tqdm=True, bf16=False)
    >>> trainer = AlignTITrainer(model=student, teacher_model=teacher, args=args, train_dataset=data,
    ...     data_collator=VLMCollator(tok), processing_class=tok,
    ...     align_loss=AlignTILoss(iva_layer=1, image_token_id=tok.convert_tokens_to_ids("<image>"),
    ...                            student_width=16, teacher_width=32))
    >>> with contextlib.redirect_stdout(io.StringIO()):
    ...     state = trainer.train()
    >>> state.global_step
    2

Reference: Chen et al., ICML 2026 (Align-TI); Agarwal et al., ICLR 2024 (GKD); TRL ``GKDTrainer``.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np
import torch

from ..common.optional import requires
from .loss import IGNORE_INDEX, AlignTILoss

requires("trl", extra="align-ti", purpose="AlignTITrainer")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # GKD lives under trl.experimental in TRL 1.16
from transformers import TrainerCallback  # noqa: E402
from trl.experimental.gkd import GKDTrainer  # noqa: E402


class _ZeroLossGrads(TrainerCallback):
    """Zeroes the loss module's gradients where ``Trainer`` zeroes the model's (``model.zero_grad()`` at the start
    and after every optimiser step): IVA's projection would otherwise accumulate its gradients over the steps."""

    def __init__(self, module: torch.nn.Module) -> None:
        self.module = module

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.module.zero_grad(set_to_none=True)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.module.zero_grad(set_to_none=True)


class VLMCollator:
    """Pads per-example ``{"input_ids", "labels", "pixel_values"}`` (1-D ids, ``(3, H, W)`` image) on the right."""

    def __init__(self, tokenizer: Any) -> None:
        self.pad = tokenizer.pad_token_id

    def __call__(self, examples: Sequence[dict[str, Any]]) -> dict[str, torch.Tensor]:
        if not examples:
            raise ValueError("examples is empty")
        width = max(len(e["input_ids"]) for e in examples)
        ids = torch.full((len(examples), width), self.pad, dtype=torch.long)
        labels = torch.full((len(examples), width), IGNORE_INDEX, dtype=torch.long)
        att = torch.zeros((len(examples), width), dtype=torch.long)
        for i, e in enumerate(examples):
            n = len(e["input_ids"])
            ids[i, :n] = torch.as_tensor(e["input_ids"])
            labels[i, :n] = torch.as_tensor(e["labels"])
            att[i, :n] = 1
        pixels = torch.stack([torch.as_tensor(e["pixel_values"]) for e in examples])
        return {"input_ids": ids, "attention_mask": att, "labels": labels, "pixel_values": pixels}


def lab_examples(
    tokenizer: Any, scenes: Any, rng: np.random.Generator, n: int, families: Sequence[str]
) -> Any:
    """A ``datasets.Dataset`` (torch format) of ``n`` lab questions: ``input_ids``, ``labels``, ``pixel_values``."""
    import datasets

    from ..common.tiny_vlm import encode, make_items, sample_scenes

    attrs = sample_scenes(scenes, rng, n)
    batch = encode(tokenizer, make_items(scenes, attrs, rng, list(families)), scenes, attrs, rng)
    out = []
    for i in range(n):
        keep = batch["attention_mask"][i].bool()
        out.append(
            {
                "input_ids": batch["input_ids"][i][keep].tolist(),
                "labels": batch["labels"][i][keep].tolist(),
                "pixel_values": batch["pixel_values"][i].numpy(),
            }
        )
    return datasets.Dataset.from_list(out).with_format("torch")


class AlignTITrainer(GKDTrainer):
    """TRL ``GKDTrainer`` whose loss is Align-TI's (``AlignTILoss``) over multimodal batches.

    Args:
        align_loss: the objective (weights, IVA layer, TPA branches); the teacher must use eager attention when
            IVA is on.
        model, teacher_model, args, ...: as ``trl.experimental.gkd.GKDTrainer`` (``args`` a ``GKDConfig`` with
            ``lmbda=0``, ``seq_kd=False``, ``temperature`` equal to ``align_loss.temperature`` and ``beta`` 0
            (``kd_direction="forward"``) or 1 (``"reverse"``)); pass a ``data_collator`` that keeps
            ``pixel_values`` (``VLMCollator``).

    Raises:
        ValueError: on-policy options on, ``temperature``/``beta`` that the loss would not honour, or an optimiser
            passed in without the loss's own parameters (IVA's projection).
    """

    _tag_names: ClassVar[list[str]] = ["trl", "gkd", "align-ti"]
    _name = "Align-TI"

    def __init__(self, *args: Any, align_loss: AlignTILoss | None = None, **kwargs: Any) -> None:
        if not isinstance(align_loss, AlignTILoss):
            raise TypeError(f"align_loss must be an AlignTILoss, got {type(align_loss).__name__}")
        config = kwargs.get("args")
        if config is None:
            raise ValueError("args (a GKDConfig) is required")
        if config.lmbda != 0 or config.seq_kd:
            raise ValueError(
                f"Align-TI distils on the ground-truth responses: set lmbda=0 and seq_kd=False "
                f"(got lmbda={config.lmbda}, seq_kd={config.seq_kd})"
            )
        # TRL: temperature samples on-policy completions (none at lmbda=0) and beta interpolates the generalised
        # JSD (0: KL(p_T || p_S), 1: KL(p_S || p_T)); Align-TI's terms are one KL direction at one temperature
        if config.temperature != align_loss.temperature:
            raise ValueError(
                f"GKDConfig.temperature={config.temperature} differs from align_loss.temperature="
                f"{align_loss.temperature} (the KD temperature this trainer uses): set them equal"
            )
        want = {"forward": 0.0, "reverse": 1.0}[align_loss.kd_direction]
        if config.beta != want:
            raise ValueError(
                f"GKDConfig.beta={config.beta} is not honoured: Align-TI's KL terms are "
                f"{align_loss.kd_direction} KL, which is beta={want} in TRL's generalised JSD (set beta={want}, or "
                f"AlignTILoss(kd_direction=...) to the other direction)"
            )
        if kwargs.get("data_collator") is None:
            raise ValueError(
                "data_collator is required (e.g. VLMCollator): GKD's ChatML collator drops images"
            )
        optimizer = (kwargs.get("optimizers") or (None, None))[0]
        if optimizer is not None:
            held = {id(p) for group in optimizer.param_groups for p in group["params"]}
            if any(id(p) not in held for p in align_loss.parameters()):
                raise ValueError(
                    "the optimizer passed in optimizers does not hold align_loss.parameters() (IVA's projection, "
                    "trained with the student): add them, e.g. as a parameter group"
                )
        super().__init__(*args, **kwargs)
        self.align_loss = align_loss.to(self.args.device)
        self.add_callback(_ZeroLossGrads(self.align_loss))

    def create_optimizer(self, model: Any = None) -> torch.optim.Optimizer:
        """TRL's optimiser over the student, plus a group for the loss's own parameters (IVA's projection), at the
        same learning rate and schedule, without weight decay (``train_vlm`` decays none)."""
        fresh = self.optimizer is None
        optimizer = super().create_optimizer(model)
        extra = [p for p in self.align_loss.parameters() if p.requires_grad]
        if fresh and extra:
            optimizer.add_param_group({"params": extra, "weight_decay": 0.0})
        return optimizer

    def compute_loss(
        self,
        model: Any,
        inputs: dict[str, torch.Tensor],
        return_outputs: bool = False,
        num_items_in_batch: Any = None,
    ) -> Any:
        """Align-TI's loss of the student ``model`` against ``self.teacher_model`` on the whole batch; with
        ``return_outputs``, ``(loss, CausalLMOutput(logits=the student's sequence logits))`` (TRL's
        ``prediction_step``)."""
        out = self.align_loss(model, self.teacher_model, inputs, return_logits=return_outputs)
        if self.model.training:
            self._align_logs = {k: float(v.detach()) for k, v in out.items() if k not in ("loss", "logits")}
        if not return_outputs:
            return out["loss"]
        from transformers.modeling_outputs import CausalLMOutput

        return out["loss"], CausalLMOutput(loss=out["loss"].detach(), logits=out["logits"])

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        """TRL's log, with the last step's Align-TI terms (``sft``, ``kd``, ``iva``, ``tpa``)."""
        logs = {**logs, **getattr(self, "_align_logs", {})}
        super().log(logs, start_time)
