"""``icml26.air.llm``: LLM clients and semantic-check backends (:mod:`icml26.air.runtime.llm`).

Kept for the path documented before AIR was split into layers (README); it only re-exports, and no AIR
module imports it.
"""

from __future__ import annotations

from .runtime.llm import (
    API_KEY_ENV,
    Completion,
    EmbeddingSemantic,
    FakeLLM,
    GGUFClient,
    LLMClient,
    LLMError,
    LLMSemantic,
    Message,
    OpenAICompatibleClient,
    RecordReplayLLM,
    client_from_config,
    parse_yes_no,
)

__all__ = [
    "API_KEY_ENV",
    "Completion",
    "EmbeddingSemantic",
    "FakeLLM",
    "GGUFClient",
    "LLMClient",
    "LLMError",
    "LLMSemantic",
    "Message",
    "OpenAICompatibleClient",
    "RecordReplayLLM",
    "client_from_config",
    "parse_yes_no",
]
