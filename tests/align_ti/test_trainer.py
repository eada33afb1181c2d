"""AlignTITrainer: TRL's GKD trainer running Align-TI's loss on LLaVA models; save / from_pretrained; bad input."""

from __future__ import annotations

import contextlib
import io

import numpy as np
import pytest
import torch

pytest.importorskip("trl")
pytest.importorskip("transformers")

from icml26.align_ti.loss import AlignTILoss
from icml26.align_ti.trainer import AlignTITrainer, VLMCollator, lab_examples
from icml26.common.tiny_vlm import SceneSpec, VLMSpec, load_vlm, save_vlm, tiny_vlm, vlm_tokenizer


@pytest.fixture()
def setup(tmp_path):
    from trl.experimental.gkd import GKDConfig

    tok, scenes = vlm_tokenizer(), SceneSpec(grid=2)
    teacher = tiny_vlm(tok, VLMSpec(hidden=32, layers=2, intermediate=64), scenes, seed=0).eval()
    student = tiny_vlm(tok, VLMSpec(hidden=16, layers=1, intermediate=32), scenes, seed=1)
    data = lab_examples(tok, scenes, np.random.default_rng(0), 16, ("patch", "count"))

    def args(**kw):
        base = dict(
            output_dir=str(tmp_path / "out"),
            max_steps=6,
            per_device_train_batch_size=8,
            report_to=[],
            lmbda=0.0,
            temperature=1.0,
            beta=0.0,
            use_cpu=True,
            save_strategy="no",
            disable_tqdm=True,
            learning_rate=3e-3,
            logging_steps=1,
            seed=0,
            bf16=False,
        )
        return GKDConfig(**{**base, **kw})

    loss = AlignTILoss(iva_layer=1, image_token_id=tok.convert_tokens_to_ids("<image>"), student_width=16,
                       teacher_width=32)
    return tok, scenes, teacher, student, data, args, loss


def test_collator_pads_by_hand():
    """Right padding: ids with the pad id, labels with -100 (padding is never a target), attention 0."""
    tok = vlm_tokenizer()
    pad = tok.pad_token_id
    pix = torch.arange(12.0).view(3, 2, 2)
    out = VLMCollator(tok)(
        [
            {"input_ids": [1, 7, 8], "labels": [-100, 8, 2], "pixel_values": pix},
            {"input_ids": torch.tensor([1, 9]), "labels": torch.tensor([-100, 2]), "pixel_values": pix + 1},
        ]
    )
    assert out["input_ids"].tolist() == [[1, 7, 8], [1, 9, pad]]
    assert out["labels"].tolist() == [[-100, 8, 2], [-100, 2, -100]]
    assert out["attention_mask"].tolist() == [[1, 1, 1], [1, 1, 0]]
    assert torch.equal(out["pixel_values"], torch.stack([pix, pix + 1]))
    with pytest.raises(ValueError, match="empty"):
        VLMCollator(tok)([])


def test_trainer_loss_is_align_ti_and_the_student_learns(setup, tmp_path):
    tok, _scenes, teacher, student, data, args, loss = setup
    trainer = AlignTITrainer(
        model=student,
        teacher_model=teacher,
        args=args(),
        train_dataset=data,
        data_collator=VLMCollator(tok),
        processing_class=tok,
        align_loss=loss,
    )
    batch = VLMCollator(tok)([data[i] for i in range(8)])
    student.eval()
    direct = float(loss(student, teacher, batch)["loss"].detach())
    assert float(trainer.compute_loss(student, batch)) == pytest.approx(direct, rel=1e-5)
    with contextlib.redirect_stdout(io.StringIO()):
        trainer.train()
    logged = [h for h in trainer.state.log_history if "loss" in h]
    assert {"sft", "kd", "iva", "tpa"} <= set(logged[0])
    # IVA's projection is in the trainer's optimiser (a group of its own, no weight decay) and has moved
    proj = loss.iva_projection.weight
    groups = [g for g in trainer.optimizer.param_groups if any(p is proj for p in g["params"])]
    assert len(groups) == 1 and groups[0]["weight_decay"] == 0.0
    assert not torch.equal(proj, torch.eye(32, 16))
    student.eval()
    assert float(loss(student, teacher, batch)["loss"].detach()) < direct
    # the trained student saves and reloads as a plain transformers model, same outputs
    save_vlm(student, tok, tmp_path / "student")
    again, _ = load_vlm(tmp_path / "student")
    with torch.no_grad():
        inputs = {k: v for k, v in batch.items() if k != "labels"}
        assert torch.allclose(student(**inputs).logits, again(**inputs).logits, atol=1e-5)


def test_trainer_bad_input(setup):
    tok, scenes, teacher, student, data, args, loss = setup
    kw = dict(model=student, teacher_model=teacher, train_dataset=data, processing_class=tok)
    with pytest.raises(ValueError, match="lmbda=0"):
        AlignTITrainer(args=args(lmbda=0.5), data_collator=VLMCollator(tok), align_loss=loss, **kw)
    with pytest.raises(ValueError, match="data_collator"):
        AlignTITrainer(args=args(), align_loss=loss, **kw)
    with pytest.raises(TypeError, match="align_loss"):
        AlignTITrainer(args=args(), data_collator=VLMCollator(tok), align_loss=None, **kw)

    class Bigger:
        pad_token_id, bos_token_id, eos_token_id = tok.pad_token_id, tok.bos_token_id, tok.eos_token_id

        def convert_tokens_to_ids(self, t):
            return tok.convert_tokens_to_ids(t)

        def __len__(self):
            return len(tok) + 3

    other = tiny_vlm(Bigger(), VLMSpec(hidden=32, layers=2, intermediate=64), scenes, seed=0)
    with pytest.raises(ValueError, match="vocab"):
        AlignTITrainer(
            model=student,
            teacher_model=other,
            args=args(),
            train_dataset=data,
            processing_class=tok,
            data_collator=VLMCollator(tok),
            align_loss=loss,
        )


def test_trainer_refuses_temperature_and_beta_it_would_ignore(setup):
    """GKDConfig's ``temperature`` and ``beta`` must agree with the loss (TRL defaults 0.9 and 0.5 do not)."""
    tok, _scenes, teacher, student, data, args, loss = setup
    kw = dict(model=student, teacher_model=teacher, train_dataset=data, processing_class=tok,
              data_collator=VLMCollator(tok))
    with pytest.raises(ValueError, match=r"temperature=0\.9 differs"):
        AlignTITrainer(args=args(temperature=0.9), align_loss=loss, **kw)
    with pytest.raises(ValueError, match=r"beta=0\.5 is not honoured"):
        AlignTITrainer(args=args(beta=0.5), align_loss=loss, **kw)
    with pytest.raises(ValueError, match=r"beta=1\.0 is not honoured"):
        AlignTITrainer(args=args(beta=1.0), align_loss=loss, **kw)
    image = tok.convert_tokens_to_ids("<image>")
    reverse = AlignTILoss(iva_layer=1, image_token_id=image, kd_direction="reverse", temperature=2.0,
                          student_width=16, teacher_width=32)
    trainer = AlignTITrainer(args=args(beta=1.0, temperature=2.0), align_loss=reverse, **kw)
    assert trainer.align_loss is reverse
    with pytest.raises(ValueError, match=r"beta=0\.0 is not honoured"):
        AlignTITrainer(args=args(temperature=2.0), align_loss=reverse, **kw)


def test_predict_returns_the_students_logits_and_the_loss(setup):
    """``predict`` (Trainer.prediction_step through compute_loss(return_outputs=True)): the student's sequence
    logits, the batch's labels and Align-TI's loss on it, equal to the direct computations."""
    tok, _scenes, teacher, student, data, args, _ = setup
    loss = AlignTILoss(iva_layer=1, image_token_id=tok.convert_tokens_to_ids("<image>"), tpa_weight=0,
                       student_width=16, teacher_width=32)
    trainer = AlignTITrainer(model=student, teacher_model=teacher, args=args(per_device_eval_batch_size=16),
                             train_dataset=data, data_collator=VLMCollator(tok), processing_class=tok,
                             align_loss=loss)
    with contextlib.redirect_stdout(io.StringIO()):
        pred = trainer.predict(data)
    batch = VLMCollator(tok)([data[i] for i in range(len(data))])
    student.eval()
    with torch.no_grad():
        logits = student(**{k: v for k, v in batch.items() if k != "labels"}).logits
        direct = float(loss(student, teacher, batch)["loss"])
    assert pred.predictions.shape == tuple(logits.shape)
    np.testing.assert_allclose(pred.predictions, logits.numpy(), atol=1e-5)
    assert np.array_equal(pred.label_ids, batch["labels"].numpy())
    assert pred.metrics["test_loss"] == pytest.approx(direct, rel=1e-5)


def test_trainer_and_the_reproduction_loop_give_the_same_student(setup):
    """The reproduction trains with the lab's loop (``train_vlm`` + ``AlignTILoss``); AlignTITrainer, fed the same
    batches in order with the same optimiser and schedule, ends at the same weights."""
    import copy

    from torch.utils.data import SequentialSampler

    from icml26.common.tiny_vlm import instruction_sampler, train_vlm, trainable_parameters

    tok, scenes, teacher, student, _, args, loss = setup
    steps, batch_size, lr = 4, 8, 3e-3
    ours, our_loss = copy.deepcopy(student), copy.deepcopy(loss)
    train_vlm(
        ours,
        instruction_sampler(tok, scenes, ("patch", "count"), batch_size),
        steps=steps,
        lr=lr,
        seed=3,
        desc=None,
        extra_params=our_loss.parameters(),
        loss_fn=lambda m, b: our_loss(m, teacher, b)["loss"],
    )
    # the same batches as rows of a dataset, in order
    rng = np.random.default_rng(3)
    sample = instruction_sampler(tok, scenes, ("patch", "count"), batch_size)
    rows = []
    for _ in range(steps):
        b = sample(rng)
        for i in range(batch_size):
            keep = b["attention_mask"][i].bool()
            rows.append(
                {
                    "input_ids": b["input_ids"][i][keep].tolist(),
                    "labels": b["labels"][i][keep].tolist(),
                    "pixel_values": b["pixel_values"][i].numpy(),
                }
            )
    import datasets

    data = datasets.Dataset.from_list(rows).with_format("torch")
    theirs, their_loss = copy.deepcopy(student), copy.deepcopy(loss)
    params = trainable_parameters(theirs, "projector+lm", their_loss.parameters())
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    n_warm = max(1, round(0.03 * steps))
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt,
        lambda s: (
            (s + 1) / n_warm if s < n_warm else 0.5 * (1 + np.cos(np.pi * (s - n_warm) / (steps - n_warm)))
        ),
    )

    class InOrder(AlignTITrainer):
        def _get_train_sampler(self, *a, **k):
            return SequentialSampler(self.train_dataset)

    trainer = InOrder(
        model=theirs,
        teacher_model=teacher,
        args=args(
            max_steps=steps, per_device_train_batch_size=batch_size, max_grad_norm=0.0, learning_rate=lr
        ),
        train_dataset=data,
        data_collator=VLMCollator(tok),
        processing_class=tok,
        align_loss=their_loss,
        optimizers=(opt, sched),
    )
    with contextlib.redirect_stdout(io.StringIO()):
        trainer.train()
    moved = 0
    for (name, a), b, s in zip(
        ours.state_dict().items(), theirs.state_dict().values(), student.state_dict().values(), strict=True
    ):
        assert torch.allclose(a, b, atol=2e-5), name
        moved += int(not torch.equal(a, s))
    assert moved > 0
    # IVA's projection trained alike in both, away from its start
    assert torch.allclose(our_loss.iva_projection.weight, their_loss.iva_projection.weight, atol=2e-5)
    assert not torch.equal(our_loss.iva_projection.weight, loss.iva_projection.weight)
    # an optimiser without the projection is refused (it would stay at its start)
    bare = torch.optim.AdamW(trainable_parameters(copy.deepcopy(student), "projector+lm"), lr=lr)
    with pytest.raises(ValueError, match=r"does not hold align_loss\.parameters"):
        InOrder(model=theirs, teacher_model=teacher, args=args(), train_dataset=data, data_collator=VLMCollator(tok),
                processing_class=tok, align_loss=copy.deepcopy(loss), optimizers=(bare, None))
