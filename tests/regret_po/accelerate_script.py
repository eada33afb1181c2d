"""RegretPOTrainer on a saved tiny checkpoint: run by ``accelerate launch`` (several processes) or in-process.

``ACCELERATE_USE_CPU=1 accelerate launch --multi_gpu --num_processes 2 accelerate_script.py MODEL_DIR OUT.json``
(two CPU processes on gloo; in accelerate 1.15 ``--cpu`` alone starts one process unless mpirun is set up) trains
two steps on eight pairs, where each step sees every pair (8 = the global batch), so the mean loss of a step does
not depend on how the pairs are split between processes; rank 0 writes the logged losses to ``OUT.json``.
"""

from __future__ import annotations

import contextlib
import io
import json
import sys
import tempfile

N_PAIRS = 8


def pairs():
    import datasets

    prompts = ["1+2=", "4+4=", "7+1=", "9+0=", "2+2=", "3+5=", "6+1=", "5+4="]
    chosen = ["3", "8", "8", "9", "4", "8", "7", "9"]
    rejected = ["4", "7", "71", "90", "5", "35", "1", "1"]
    return datasets.Dataset.from_dict({"prompt": prompts, "chosen": chosen, "rejected": rejected})


def train(model_dir: str, num_processes: int) -> list[float]:
    """Train 2 steps of RePO_det (global batch = all 8 pairs) from ``model_dir``; the logged loss per step.

    Plain SGD: Adam's first step is about lr * sign(g) for every weight, which turns float32 rounding differences
    in near-zero gradients (one sum over 8 pairs vs an all-reduce of two sums over 4) into full-size steps."""
    import datasets
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from icml26.regret_po.trainer import RegretPOConfig, RegretPOTrainer

    torch.set_num_threads(1)
    datasets.disable_progress_bars()
    tok = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(model_dir, local_files_only=True)
    ref = AutoModelForCausalLM.from_pretrained(model_dir, local_files_only=True)
    with tempfile.TemporaryDirectory() as out:
        args = RegretPOConfig(
            output_dir=out,
            max_steps=2,
            per_device_train_batch_size=N_PAIRS // num_processes,
            learning_rate=0.5,
            optim="sgd",
            report_to="none",
            use_cpu=True,
            logging_steps=1,
            disable_tqdm=True,
            save_strategy="no",
            deterministic=True,
            seed=0,
            lr_scheduler_type="constant",
        )
        trainer = RegretPOTrainer(
            model, ref_model=ref, args=args, train_dataset=pairs(), processing_class=tok
        )
        with contextlib.redirect_stdout(io.StringIO()):
            trainer.train()
        acc = trainer.accelerator
        if acc.num_processes != num_processes or acc.device.type != "cpu":
            raise RuntimeError(
                f"expected {num_processes} CPU processes, accelerate runs {acc.num_processes} on {acc.device}"
            )
        losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
        return losses if trainer.accelerator.is_main_process else []


if __name__ == "__main__":
    losses = train(sys.argv[1], int(sys.argv[3]) if len(sys.argv) > 3 else 2)
    if losses:
        with open(sys.argv[2], "w") as f:
            json.dump(losses, f)
