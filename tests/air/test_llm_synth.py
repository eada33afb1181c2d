"""LLM clients (fake, record/replay, OpenAI-compatible over a local HTTP server) and eradication gates."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import ClassVar

import pytest

pytest.importorskip("lark")

from icml26.air import LLMSynthesizer, RuleValidator, TemplateSynthesizer, TraceStep, parse
from icml26.air.core import Incident
from icml26.air.dsl import Evaluator
from icml26.air.runtime.llm import FakeLLM, GGUFClient, LLMError, OpenAICompatibleClient, RecordReplayLLM

RULE = parse('''rule share severity critical on after_action(drive.share_file)
detect
  : call.args.email in ctx.strings_from_tool_outputs
  : state.drive.f1.shared_with != []
contain - block
eradicate synthesize rule scope drive.share_file
end''')[0]


def _incident(email="evil@x.io"):
    inc = Incident(1, "share", "critical", "after_action", 2, None, {}, 0.0)
    inc.pre_bindings = {"call": {"name": "drive.share_file", "args": {"file_id": "f1", "email": email}},
                        "state": {"drive": {"f1": {"shared_with": []}}},
                        "ctx": {"user_task": "summarise", "strings_from_tool_outputs": [email]},
                        "result": None, "snap": {"pre_step": {}}}
    return inc


BENIGN = [[TraceStep({"name": "drive.share_file", "args": {"file_id": "f1", "email": "bob@c.com"}},
                     {"drive": {"f1": {"shared_with": []}}}, {"user_task": "share with bob@c.com",
                                                               "strings_from_tool_outputs": []})]]


def test_template_keeps_only_pre_action_conditions():
    r = TemplateSynthesizer().synthesize(_incident(), RULE, Evaluator())
    assert r.triggers[0].phase == "before_action" and r.triggers[0].tools == ("drive.share_file",)
    # shared_with != [] was false before the call (an effect of it): dropped
    assert [c.op for c in r.detect] == ["in"] and r.provenance == "template"
    verdict = RuleValidator(BENIGN).validate(r, _incident(), Evaluator())
    assert verdict.accepted, verdict.reason


def test_validator_rejections():
    ev = Evaluator()
    v = RuleValidator(BENIGN)
    widening = parse("rule w on after_action(drive.share_file) detect : call.name == \"drive.share_file\" end")[0]
    assert "prevention-only" in v.validate(widening, _incident(), ev).reason
    silent = parse('rule q on before_action(drive.share_file) detect : call.args.email == "nobody" '
                   "contain - block end")[0]
    assert "does not fire" in v.validate(silent, _incident(), ev).reason
    noisy = parse('rule n on before_action(drive.share_file) detect : call.name == "drive.share_file" '
                  "contain - block end")[0]
    verdict = v.validate(noisy, _incident(), ev)
    assert not verdict.accepted and "benign traces" in verdict.reason and verdict.fp_rate == 1.0
    with pytest.raises(ValueError, match="fp_threshold"):
        RuleValidator(fp_threshold=2)


def test_llm_synthesizer_parses_never_executes_and_falls_back():
    good = FakeLLM(['Here you go:\nrule x on before_action(drive.share_file)\ndetect\n'
                    '  : call.args.email in ctx.strings_from_tool_outputs\ncontain\n  - block\nend'])
    r = LLMSynthesizer(good, structured=False).synthesize(_incident(), RULE, Evaluator())
    assert r.name == "share__llm" and r.provenance == "llm"
    assert "drive.share_file" in good.prompts[0][0]["content"]
    garbage = LLMSynthesizer(FakeLLM(["__import__('os').system('rm -rf /')"]), structured=False)
    r2 = garbage.synthesize(_incident(), RULE, Evaluator())
    assert r2.provenance == "llm->template" and garbage.failures
    down = LLMSynthesizer(FakeLLM([]))                      # raises LLMError: out of answers
    assert down.synthesize(_incident(), RULE, Evaluator()).provenance == "llm->template"


def test_fake_and_record_replay(tmp_path):
    fake = FakeLLM({"hello": "hi"})
    assert fake.complete([{"role": "user", "content": "hello there"}]).text == "hi"
    with pytest.raises(LLMError, match="no scripted answer"):
        fake.complete([{"role": "user", "content": "bye"}])
    with pytest.raises(TypeError, match="role"):
        fake.complete([{"text": "x"}])
    cassette = tmp_path / "c.jsonl"
    rec = RecordReplayLLM(cassette, inner=FakeLLM(["recorded"]), model="m")
    msgs = [{"role": "user", "content": "q"}]
    assert rec.complete(msgs).text == "recorded"
    replay = RecordReplayLLM(cassette, model="m")
    assert replay.complete(msgs).text == "recorded"
    with pytest.raises(LLMError, match="no cassette entry"):
        replay.complete([{"role": "user", "content": "other"}])


class _Handler(BaseHTTPRequestHandler):
    answers: ClassVar[list] = []

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        _Handler.seen = (self.path, body, self.headers.get("Authorization"))
        payload = _Handler.answers.pop(0)
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(payload.encode() if isinstance(payload, str) else json.dumps(payload).encode())

    def log_message(self, *args):
        pass


def test_openai_compatible_client_over_http():
    server = HTTPServer(("127.0.0.1", 0), _Handler)
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/v1"
        client = OpenAICompatibleClient(url, "tiny", api_key="k", timeout=5)
        _Handler.answers = [{"choices": [{"message": {"content": "YES"}}], "usage": {"total_tokens": 3}},
                            "not json", {"unexpected": 1}]
        out = client.complete([{"role": "user", "content": "hi"}], max_tokens=2)
        assert out.text == "YES" and out.usage["total_tokens"] == 3
        path, body, auth = _Handler.seen
        assert path == "/v1/chat/completions" and body["model"] == "tiny" and auth == "Bearer k"
        with pytest.raises(LLMError, match="JSON"):
            client.complete([{"role": "user", "content": "hi"}])
        with pytest.raises(LLMError, match="unexpected response"):
            client.complete([{"role": "user", "content": "hi"}])
    finally:
        server.shutdown()
    with pytest.raises(LLMError, match="failed"):
        OpenAICompatibleClient("http://127.0.0.1:9", "m", timeout=1).complete([{"role": "user", "content": "x"}])
    with pytest.raises(ValueError, match="base_url"):
        OpenAICompatibleClient("localhost:8000", "m")


def test_gguf_backend_needs_its_packages():
    try:
        import gguf  # noqa: F401
    except ImportError:
        with pytest.raises(ImportError, match="agents-llm"):
            GGUFClient()
    else:  # pragma: no cover - only where the optional model is installed
        pytest.skip("gguf installed: the plumbing backend is exercised manually (slow load)")
