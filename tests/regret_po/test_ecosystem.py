"""RegretPOTrainer through the ecosystem: two processes under ``accelerate launch`` give the single-process loss,
and a PEFT LoRA adapter trained on a saved checkpoint reloads with ``from_pretrained`` to the same outputs."""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("trl")
pytest.importorskip("accelerate")
peft = pytest.importorskip("peft")

from icml26.common.tiny_lm import char_tokenizer, save_lab_model, tiny_causal_lm  # noqa: E402

from . import accelerate_script  # noqa: E402

HERE = Path(__file__).parent
#: float32 sums over 4 + 4 pairs (and an all-reduced gradient) against one sum over 8: a few ulps per step
LOSS_TOL = 1e-4


@pytest.fixture(scope="module")
def saved_model(tmp_path_factory):
    tok = char_tokenizer()
    return save_lab_model(
        tiny_causal_lm(len(tok), hidden=32, intermediate=64, seed=0),
        tok,
        tmp_path_factory.mktemp("tiny") / "model",
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_accelerate_two_cpu_processes_match_one(saved_model, tmp_path):
    out = tmp_path / "losses.json"
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "OMP_NUM_THREADS": "1",
        "ACCELERATE_USE_CPU": "1",
        "TRANSFORMERS_VERBOSITY": "error",
        "PYTHONPATH": os.pathsep.join([str(HERE.parents[1]), os.environ.get("PYTHONPATH", "")]),
    }
    # accelerate 1.15: `--cpu` picks the single-process launcher (several CPU processes need mpirun); the torch
    # distributed launcher behind `--multi_gpu`, with ACCELERATE_USE_CPU=1, starts 2 CPU processes on gloo
    cmd = [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--multi_gpu",
        "--num_processes",
        "2",
        "--num_machines",
        "1",
        "--mixed_precision",
        "no",
        "--dynamo_backend",
        "no",
        "--main_process_port",
        str(_free_port()),
        str(HERE / "accelerate_script.py"),
        str(saved_model),
        str(out),
        "2",
    ]
    # a new session, so that on a timeout the launcher and both workers are killed together (none left behind)
    proc = subprocess.Popen(
        cmd,
        env=env,
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        log, _ = proc.communicate(timeout=240)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail("accelerate launch did not finish in 240 s")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, log[-3000:]
    two = json.loads(out.read_text())
    one = accelerate_script.train(str(saved_model), num_processes=1)
    assert len(one) == len(two) == 2
    # the second step's loss also checks that the two processes' gradients were averaged like one batch's
    assert two == pytest.approx(one, abs=LOSS_TOL)
    assert one[1] < one[0]  # the update lowered the loss on the same pairs


def test_peft_lora_adapter_trains_saves_and_reloads(saved_model, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from icml26.regret_po.trainer import RegretPOConfig, RegretPOTrainer

    tok = AutoTokenizer.from_pretrained(saved_model, local_files_only=True)
    base = AutoModelForCausalLM.from_pretrained(saved_model, local_files_only=True)
    lora = peft.LoraConfig(
        r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0, task_type="CAUSAL_LM"
    )
    args = RegretPOConfig(
        output_dir=str(tmp_path / "run"),
        max_steps=2,
        per_device_train_batch_size=4,
        learning_rate=5e-2,
        report_to="none",
        use_cpu=True,
        logging_steps=1,
        disable_tqdm=True,
        save_strategy="no",
        deterministic=True,
        seed=0,
    )
    # no ref_model: the reference is the base model with the adapter disabled
    trainer = RegretPOTrainer(
        base, args=args, train_dataset=accelerate_script.pairs(), processing_class=tok, peft_config=lora
    )
    with contextlib.redirect_stdout(io.StringIO()):
        trainer.train()
    trained = trainer.model.eval()
    assert isinstance(trained, peft.PeftModel) and trainer.ref_model is None
    adapter_dir = tmp_path / "adapter"
    trained.save_pretrained(adapter_dir)
    assert (adapter_dir / "adapter_config.json").is_file()

    reloaded = peft.PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(saved_model, local_files_only=True), adapter_dir
    ).eval()
    plain = AutoModelForCausalLM.from_pretrained(saved_model, local_files_only=True).eval()
    ids = torch.tensor([tok("1+2=3", add_special_tokens=False)["input_ids"]])
    saved, loaded = peft.get_peft_model_state_dict(trained), peft.get_peft_model_state_dict(reloaded)
    assert saved.keys() == loaded.keys() and len(saved) == 8  # A and B of q_proj, v_proj in 2 layers
    for key in saved:
        assert torch.equal(saved[key], loaded[key]), key
    with torch.no_grad():
        # the class's forward: TRL re-binds the trained model's ``forward`` to its fused-LM-head path, whose float32
        # logits differ from the plain forward's in the third decimal
        want = type(trained).forward(trained, input_ids=ids).logits
        got, before = reloaded(input_ids=ids).logits, plain(input_ids=ids).logits
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    assert (got - before).abs().max() > 1e-4  # the adapter learned something, and the reload carries it
    # merged into the base weights, the adapter gives the same outputs again
    merged = reloaded.merge_and_unload()
    with torch.no_grad():
        torch.testing.assert_close(merged(input_ids=ids).logits, want, rtol=1e-4, atol=1e-5)
