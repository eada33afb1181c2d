"""The tiny-language-model lab shared by the LLM papers (RePO, PS-PPO, SPARD, COCA, unsafe MoE, ...).

Everything a CPU reproduction of an LLM method needs, built from ``transformers`` configs and ``tokenizers``:

- ``char_tokenizer()``: a character-level tokenizer (``tokenizers`` WordLevel + one-character split + Fuse
  decoder) wrapped as a ``PreTrainedTokenizerFast`` with ``<pad> <s> </s> <unk>``;
- ``tiny_causal_lm(vocab_size, family="llama" | "mixtral" | "qwen2_moe" | "olmoe", ...)``: a randomly initialised
  model from a small config (seeded); ``save_lab_model`` / ``load_lab_model`` go through the real
  ``save_pretrained`` / ``from_pretrained`` path on a local directory (``local_files_only``);
- synthetic tasks with verifiable rewards at several difficulty levels (``AdditionChain``, ``Sorting``,
  ``Reverse``): ``sample(rng)`` gives a prompt and its correct completion (a scratchpad where the task has one),
  ``noisy_completion`` a corrupted one, ``reward`` checks a completion;
- ``completion_batch`` / ``completion_logps``: right-padded (prompt + completion) batches and per-token
  log-probabilities of the completion tokens (the layout TRL's preference collator uses);
- ``sft``: a supervised warm start on completion tokens; ``generate``: greedy or sampled completions (HF
  ``generate``, left padding, seeded); ``accuracy``: greedy task accuracy;
- ``cached``: a directory cache keyed by everything that determines a model, so a quick run does not retrain
  what it already trained (deterministic training makes a cache hit identical to a retrain).

One torch thread by default on this machine (set by ``icml26 reproduce``). Needs the ``hf`` extra.

Example:
    >>> import numpy as np
    >>> tok = char_tokenizer()
    >>> task = AdditionChain(terms=3, max_value=9)
    >>> ex = task.sample(np.random.default_rng(0))
    >>> ex.prompt, ex.completion, task.reward(ex.prompt, ex.completion)
    ('8+6+5=', '8+6=14;14+5=19', 1.0)
    >>> model = tiny_causal_lm(len(tok), seed=0)
    >>> type(model).__name__, tok.decode(tok(ex.prompt)["input_ids"])
    ('LlamaForCausalLM', '8+6+5=')
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .cache import cache_dir as cache_dir  # re-exported: the papers read their cache folder from here
from .optional import requires
from .progress import progress

ALPHABET = "0123456789+-*=;,:abcdefghijklmnopqrstuvwxyz ."
SPECIAL_TOKENS = ("<pad>", "<s>", "</s>", "<unk>")


def _quiet_transformers() -> None:
    transformers = requires("transformers", extra="hf", purpose="the tiny-language-model lab")
    transformers.utils.logging.disable_progress_bar()
    transformers.utils.logging.set_verbosity_error()


def char_tokenizer(alphabet: str = ALPHABET) -> Any:
    """A character-level ``PreTrainedTokenizerFast``: one token per character of ``alphabet`` plus specials."""
    _quiet_transformers()
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    if len(set(alphabet)) != len(alphabet):
        raise ValueError("alphabet has repeated characters")
    vocab = {t: i for i, t in enumerate([*SPECIAL_TOKENS, *alphabet])}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    core.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", bos_token="<s>", eos_token="</s>",
                                   unk_token="<unk>")


def tiny_causal_lm(vocab_size: int, *, family: str = "llama", hidden: int = 64, layers: int = 2, heads: int = 4,
                   kv_heads: int = 2, intermediate: int = 128, max_positions: int = 96, experts: int = 8,
                   top_k: int = 2, seed: int = 0) -> Any:
    """A randomly initialised causal LM from a small ``transformers`` config (seeded).

    ``family``: ``"llama"`` (default), or the mixture-of-experts families ``"mixtral"``, ``"qwen2_moe"``,
    ``"olmoe"`` (``experts`` experts, ``top_k`` routed per token).
    """
    _quiet_transformers()
    import transformers as tf

    common = dict(vocab_size=vocab_size, hidden_size=hidden, intermediate_size=intermediate, num_hidden_layers=layers,
                  num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=max_positions,
                  pad_token_id=0, bos_token_id=1, eos_token_id=2, tie_word_embeddings=False)
    if family == "llama":
        config, cls = tf.LlamaConfig(**common), tf.LlamaForCausalLM
    elif family == "mixtral":
        config, cls = tf.MixtralConfig(**common, num_local_experts=experts, num_experts_per_tok=top_k), \
            tf.MixtralForCausalLM
    elif family == "qwen2_moe":
        config = tf.Qwen2MoeConfig(**common, num_experts=experts, num_experts_per_tok=top_k,
                                   moe_intermediate_size=intermediate, shared_expert_intermediate_size=intermediate,
                                   norm_topk_prob=False)
        cls = tf.Qwen2MoeForCausalLM
    elif family == "olmoe":
        config, cls = tf.OlmoeConfig(**common, num_experts=experts, num_experts_per_tok=top_k), tf.OlmoeForCausalLM
    else:
        raise ValueError(f"family must be 'llama', 'mixtral', 'qwen2_moe' or 'olmoe', got {family!r}")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = cls(config)
    return model


def save_lab_model(model: Any, tokenizer: Any, path: str | os.PathLike[str]) -> Path:
    """``save_pretrained`` model and tokenizer into ``path`` (a directory)."""
    _quiet_transformers()
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def load_lab_model(path: str | os.PathLike[str]) -> tuple[Any, Any]:
    """Load a saved model and tokenizer with ``from_pretrained(path, local_files_only=True)`` (never the hub)."""
    _quiet_transformers()
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if not Path(path, "config.json").is_file():
        raise FileNotFoundError(f"{path} holds no saved model (config.json missing)")
    model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True)
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    if tokenizer.pad_token_id is None:
        raise ValueError(f"the tokenizer in {path} has no pad token; set one before training")
    return model, tokenizer


# ------------------------------------------------------------------------------------------------------- tasks
@dataclass(frozen=True)
class Example:
    """A prompt, its correct completion and the final answer the reward checks."""

    prompt: str
    completion: str
    answer: str


class Task:
    """A synthetic task with a verifiable reward. Subclasses implement ``sample`` and ``_corrupt``."""

    name = "task"

    def sample(self, rng: np.random.Generator) -> Example:
        raise NotImplementedError

    def answer_of(self, completion: str) -> str:
        """The final answer in a completion (the text after the last '=' or ';', or all of it)."""
        return completion.strip().split(";")[-1].split("=")[-1].strip()

    def reward(self, prompt: str, completion: str) -> float:
        """1.0 if the completion's final answer is correct, else 0.0."""
        return float(self.answer_of(completion) == self.solve(prompt).answer)

    def solve(self, prompt: str) -> Example:
        raise NotImplementedError

    def noisy_completion(self, example: Example, rng: np.random.Generator, noise: float) -> str:
        """The correct completion with each step corrupted with probability ``noise`` (wrong steps propagate)."""
        return self._corrupt(example, rng, noise)

    def _corrupt(self, example: Example, rng: np.random.Generator, noise: float) -> str:
        raise NotImplementedError


class AdditionChain(Task):
    """``a+b+c=`` -> scratchpad ``a+b=s1;s1+c=s2``; difficulty by the number of terms and their size."""

    name = "addition"

    def __init__(self, terms: int = 3, max_value: int = 9):
        if terms < 2 or max_value < 1:
            raise ValueError(f"need terms >= 2 and max_value >= 1, got {terms}, {max_value}")
        self.terms, self.max_value = terms, max_value

    def sample(self, rng: np.random.Generator) -> Example:
        values = [int(v) for v in rng.integers(0, self.max_value + 1, size=self.terms)]
        return self.solve("+".join(map(str, values)) + "=")

    def solve(self, prompt: str) -> Example:
        values = [int(v) for v in prompt.rstrip("=").split("+")]
        steps, total = [], values[0]
        for v in values[1:]:
            steps.append(f"{total}+{v}={total + v}")
            total += v
        return Example(prompt, ";".join(steps), str(total))

    def step_errors(self, prompt: str, completion: str) -> int:
        """Number of scratchpad steps that are wrong or missing (for regret-style labels)."""
        truth = self.solve(prompt).completion.split(";")
        got = completion.split(";")
        return sum(1 for i, t in enumerate(truth) if i >= len(got) or got[i] != t) + max(0, len(got) - len(truth))

    def _corrupt(self, example: Example, rng: np.random.Generator, noise: float) -> str:
        values = [int(v) for v in example.prompt.rstrip("=").split("+")]
        steps, total = [], values[0]
        for v in values[1:]:
            result = total + v
            if rng.random() < noise:
                result += int(rng.choice([-2, -1, 1, 2]))
                result = max(result, 0)
            steps.append(f"{total}+{v}={result}")
            total = result
        return ";".join(steps)


class Sorting(Task):
    """``sort:3,1,2=`` -> ``1,2,3``; difficulty by the list length."""

    name = "sorting"

    def __init__(self, length: int = 4, max_value: int = 9):
        self.length, self.max_value = length, max_value

    def sample(self, rng: np.random.Generator) -> Example:
        values = rng.integers(0, self.max_value + 1, size=self.length)
        return self.solve("sort:" + ",".join(map(str, values)) + "=")

    def solve(self, prompt: str) -> Example:
        values = sorted(int(v) for v in prompt[len("sort:"):].rstrip("=").split(","))
        answer = ",".join(map(str, values))
        return Example(prompt, answer, answer)

    def _corrupt(self, example: Example, rng: np.random.Generator, noise: float) -> str:
        items = example.completion.split(",")
        if rng.random() < noise and len(items) > 1:
            i = int(rng.integers(0, len(items) - 1))
            items[i], items[i + 1] = items[i + 1], items[i]
        return ",".join(items)


class Reverse(Task):
    """``rev:abc=`` -> ``cba``; difficulty by the word length."""

    name = "reverse"

    def __init__(self, length: int = 5):
        self.length = length

    def sample(self, rng: np.random.Generator) -> Example:
        word = "".join(rng.choice(list("abcdefghijklmnopqrstuvwxyz"), size=self.length))
        return self.solve(f"rev:{word}=")

    def solve(self, prompt: str) -> Example:
        word = prompt[len("rev:"):].rstrip("=")
        return Example(prompt, word[::-1], word[::-1])

    def _corrupt(self, example: Example, rng: np.random.Generator, noise: float) -> str:
        chars = list(example.completion)
        for i in range(len(chars)):
            if rng.random() < noise:
                chars[i] = str(rng.choice(list("abcdefghijklmnopqrstuvwxyz")))
        return "".join(chars)


# ------------------------------------------------------------------------------------ batches and log-probs
def completion_batch(tokenizer: Any, prompts: Sequence[str], completions: Sequence[str], *,
                     add_eos: bool = True) -> dict[str, torch.Tensor]:
    """Right-padded ``input_ids``, ``attention_mask`` and ``completion_mask`` for prompt + completion (+ eos)."""
    if len(prompts) != len(completions):
        raise ValueError(f"{len(prompts)} prompts but {len(completions)} completions")
    if tokenizer.pad_token_id is None:
        raise ValueError("the tokenizer has no pad token")
    rows, masks = [], []
    for p, c in zip(prompts, completions, strict=True):
        p_ids = tokenizer(p, add_special_tokens=False)["input_ids"]
        c_ids = tokenizer(c, add_special_tokens=False)["input_ids"] + ([tokenizer.eos_token_id] if add_eos else [])
        if not c_ids:
            raise ValueError(f"empty completion for prompt {p!r}")
        rows.append(p_ids + c_ids)
        masks.append([0] * len(p_ids) + [1] * len(c_ids))
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), tokenizer.pad_token_id, dtype=torch.long)
    att = torch.zeros((len(rows), width), dtype=torch.long)
    comp = torch.zeros((len(rows), width), dtype=torch.long)
    for i, (r, m) in enumerate(zip(rows, masks, strict=True)):
        ids[i, : len(r)] = torch.tensor(r)
        att[i, : len(r)] = 1
        comp[i, : len(m)] = torch.tensor(m)
    return {"input_ids": ids, "attention_mask": att, "completion_mask": comp}


def completion_logps(model: Any, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token log-probabilities ``(B, T-1)`` of each next token, and the matching completion mask.

    Position t holds log p(input_ids[t+1] | input_ids[:t+1]); the mask is ``completion_mask[:, 1:]``.
    """
    return _logps_of(model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits, batch)


def _logps_of(logits: torch.Tensor, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    logps = torch.log_softmax(logits[:, :-1].float(), dim=-1).gather(-1, batch["input_ids"][:, 1:, None]).squeeze(-1)
    return logps, batch["completion_mask"][:, 1:].to(logps.dtype)


def sft(model: Any, tokenizer: Any, prompts: Sequence[str], completions: Sequence[str], *, steps: int,
        batch_size: int = 32, lr: float = 3e-3, seed: int = 0, desc: str | None = "sft",
        aux_loss_coef: float = 0.0) -> Any:
    """Supervised fine-tuning on the completion tokens (mean token NLL), AdamW, seeded batches.

    ``aux_loss_coef > 0`` adds that multiple of a mixture-of-experts model's load-balancing loss
    (``model(..., output_router_logits=True).aux_loss``), which keeps the router from collapsing onto few experts.
    """
    if not prompts:
        raise ValueError("sft needs at least one example")
    if aux_loss_coef < 0:
        raise ValueError(f"aux_loss_coef must be >= 0, got {aux_loss_coef}")
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    g = np.random.default_rng(seed)
    model.train()
    for _ in progress(range(steps), desc=desc) if desc else range(steps):
        idx = g.integers(0, len(prompts), size=batch_size)
        batch = completion_batch(tokenizer, [prompts[i] for i in idx], [completions[i] for i in idx])
        if aux_loss_coef:
            out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                        output_router_logits=True)
            if getattr(out, "aux_loss", None) is None:
                raise TypeError(f"aux_loss_coef needs a mixture-of-experts model; {type(model).__name__} "
                                "returns no aux_loss")
            logps, mask = _logps_of(out.logits, batch)
            loss = -(logps * mask).sum() / mask.sum() + aux_loss_coef * out.aux_loss
        else:
            logps, mask = completion_logps(model, batch)
            loss = -(logps * mask).sum() / mask.sum()
        if not torch.isfinite(loss):
            raise FloatingPointError(f"sft loss is {float(loss)}")
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return model.eval()


@torch.no_grad()
def generate(model: Any, tokenizer: Any, prompts: Sequence[str], *, max_new_tokens: int = 24,
             temperature: float = 0.0, seed: int = 0, batch_size: int = 64) -> list[str]:
    """Completions for ``prompts``: greedy (``temperature=0``) or sampled at ``temperature`` (seeded)."""
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    model.eval()
    side = tokenizer.padding_side
    tokenizer.padding_side = "left"
    out: list[str] = []
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            for i in range(0, len(prompts), batch_size):
                enc = tokenizer(list(prompts[i:i + batch_size]), return_tensors="pt", padding=True,
                                add_special_tokens=False)
                kwargs: dict[str, Any] = dict(max_new_tokens=max_new_tokens, pad_token_id=tokenizer.pad_token_id,
                                              eos_token_id=tokenizer.eos_token_id)
                kwargs.update(do_sample=True, temperature=temperature, top_k=0) if temperature > 0 else kwargs.update(
                    do_sample=False)
                ids = model.generate(**enc, **kwargs)
                out += tokenizer.batch_decode(ids[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)
    finally:
        tokenizer.padding_side = side
    return out


def accuracy(model: Any, tokenizer: Any, task: Task, prompts: Sequence[str], **kwargs: Any) -> float:
    """Share of ``prompts`` whose greedy completion earns reward 1."""
    completions = generate(model, tokenizer, prompts, **kwargs)
    return float(np.mean([task.reward(p, c) for p, c in zip(prompts, completions, strict=True)]))


# ------------------------------------------------------------------------------------------------------ cache
def cached(key: dict[str, Any], build: Callable[[], tuple[Any, Any]]) -> tuple[Any, Any]:
    """``load_lab_model`` of the directory keyed by ``key``, building and saving it atomically on a miss.

    ``key`` must hold everything that determines the model but the code (config, task, steps, seed); the code that
    trains it is keyed by ``common.cache.code_digest(build)``. Faults
    (a corrupt entry healed, a read-only cache run uncached, ...) are ``common.cache.cached_entry``'s.
    """
    from .cache import cached_entry

    return cached_entry("tiny_lm", key, build, save=lambda pair, path: save_lab_model(*pair, path),
                        load=load_lab_model)


# ------------------------------------------------------------------------------------------------ SFT start
def sft_start(key: dict[str, Any], data: Callable[[], tuple[Sequence[str], Sequence[str]]], *, steps: int,
              hidden: int, seed: int, desc: str | None = "sft") -> tuple[Any, Any]:
    """``(model, tokenizer)``: a cached SFT warm start, in eval mode.

    On a cache miss (``cached(key, ...)``): a ``char_tokenizer``, then ``data()`` (prompts, completions), then a
    two-layer ``tiny_causal_lm`` (``hidden``, MLP width ``2 * hidden``, seeded by ``seed``), then ``sft`` for
    ``steps`` steps seeded by ``seed``. ``key`` must hold everything that determines the model, ``data`` included.
    """
    def build() -> tuple[Any, Any]:
        tok = char_tokenizer()
        prompts, completions = data()
        model = tiny_causal_lm(len(tok), hidden=hidden, layers=2, intermediate=2 * hidden, seed=seed)
        sft(model, tok, list(prompts), list(completions), steps=steps, seed=seed, desc=desc)
        return model, tok

    model, tok = cached(key, build)
    return model.eval(), tok
