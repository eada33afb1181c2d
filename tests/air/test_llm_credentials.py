"""Issue #45 item 4: an LLM key comes from ICML26_LLM_API_KEY only and never leaves over plain HTTP or a redirect."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import ClassVar

import pytest

from icml26.air.runtime.llm import API_KEY_ENV, LLMError, OpenAICompatibleClient

MSG = [{"role": "user", "content": "hi"}]


def _serve(handler):
    server = HTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/v1"


class _Seen(BaseHTTPRequestHandler):
    auth: ClassVar[list] = []

    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        _Seen.auth.append(self.headers.get("Authorization"))
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(b'{"choices": [{"message": {"content": "YES"}}]}')

    def log_message(self, *args):
        pass


def test_the_key_comes_from_icml26_llm_api_key_only(monkeypatch):
    server, url = _serve(_Seen)
    try:
        monkeypatch.setenv("OPENAI_API_KEY", "provider-secret")
        monkeypatch.delenv(API_KEY_ENV, raising=False)
        _Seen.auth = []
        OpenAICompatibleClient(url, "m", timeout=5).complete(MSG)
        assert _Seen.auth == [None]                      # a provider's own variable is never read
        monkeypatch.setenv(API_KEY_ENV, "ours")
        OpenAICompatibleClient(url, "m", timeout=5).complete(MSG)
        assert _Seen.auth == [None, "Bearer ours"]
    finally:
        server.shutdown()


@pytest.mark.parametrize("url", ["http://10.0.0.5:8000/v1", "http://example.com/v1", "http://127.0.0.1.evil.com/v1"])
def test_a_key_is_refused_over_plain_http_to_a_remote_host(url, monkeypatch):
    with pytest.raises(ValueError, match="plain http"):
        OpenAICompatibleClient(url, "m", api_key="k")
    monkeypatch.setenv(API_KEY_ENV, "k")
    with pytest.raises(ValueError, match="plain http"):
        OpenAICompatibleClient(url, "m")
    monkeypatch.delenv(API_KEY_ENV)
    assert OpenAICompatibleClient(url, "m").api_key is None           # no key: plain HTTP is the user's business


@pytest.mark.parametrize("url", ["https://api.example.com/v1", "http://localhost:8000/v1", "http://127.0.0.1:8000/v1",
                                 "http://[::1]:8000/v1"])
def test_a_key_is_sent_over_https_or_to_a_loopback_host(url):
    assert OpenAICompatibleClient(url, "m", api_key="k").api_key == "k"


def test_redirects_are_not_followed_so_the_key_stays_with_the_named_host():
    _Seen.auth = []
    target, target_url = _serve(_Seen)

    class _Redirect(BaseHTTPRequestHandler):
        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(307)
            self.send_header("Location", f"{target_url}/chat/completions")
            self.end_headers()

        def log_message(self, *args):
            pass

    source, source_url = _serve(_Redirect)
    try:
        with pytest.raises(LLMError, match="failed"):
            OpenAICompatibleClient(source_url, "m", api_key="k", timeout=5).complete(MSG)
        assert _Seen.auth == []                          # the redirect target never saw the key
    finally:
        source.shutdown()
        target.shutdown()
