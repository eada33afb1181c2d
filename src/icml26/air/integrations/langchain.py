"""AIR's integrations layer, LangChain: AIR as agent middleware.

For ``langchain`` 1.x ``create_agent(..., middleware=[...])``.

Hook mapping:

- ``before_agent``: a new episode; the user's task is the first human message.
- ``before_model``: ``responder.before_step()``; a stop (or an earlier stop) ends the run with an AI message saying
  why (``jump_to="end"``).
- ``wrap_tool_call``: ``before_action`` (a block answers the model with an error ``ToolMessage`` instead of running
  the tool); the tool runs (an exception becomes an error ``ToolMessage``, also shown to AIR); ``after_action`` (a
  block replaces the output with AIR's message; guidance is appended to the output for the model to act on; direct
  recovery runs the agent's own tools).
- ``after_agent``: ``responder.finish()`` (end-of-episode checks and eradication).

Every hook has its async twin (``abefore_agent``, ``abefore_model``, ``awrap_tool_call``, ``aafter_agent``), so
``agent.ainvoke`` / ``agent.astream`` work: AIR's checks run in a worker thread (a state provider may block),
the tool itself is awaited, and direct recovery awaits async-only tools on the agent's event loop. Tool calls
pass through AIR one at a time (a lock around before-action, the tool and after-action), so each action is
judged on the state it found and left, even when the agent runs several tool calls concurrently.

Example:
    >>> from langchain_core.tools import tool
    >>> from icml26.air import DictState, IncidentResponder, parse
    >>> @tool
    ... def delete(path: str) -> str:
    ...     '''Delete a file.'''
    ...     return "deleted"
    >>> rules = parse('rule r on before_action(delete) detect : call.args.path == "/etc" contain - block end')
    >>> mw = AIRMiddleware(IncidentResponder(rules, DictState(dict)), tools=[delete])
    >>> type(mw).__name__
    'AIRMiddleware'
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from ...common.optional import requires
from ..core.records import ToolCall
from ..runtime.responder import IncidentResponder

requires("langchain", extra="agents-langchain", purpose="the AIR LangChain middleware")

from langchain.agents.middleware import AgentMiddleware, hook_config  # noqa: E402
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage  # noqa: E402


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(c.get("text", "") if isinstance(c, dict) else str(c) for c in content)
    return str(content)


class AIRMiddleware(AgentMiddleware):
    """Runs an :class:`~icml26.air.runtime.responder.IncidentResponder` inside a LangChain agent.

    Args:
        responder: the AIR runtime (its ``state`` provider reads the environment the tools act on).
        tools: the agent's tools, used as the executor of direct recovery calls.
    """

    def __init__(self, responder: IncidentResponder, tools: Sequence[Any] = ()):
        super().__init__()
        if not isinstance(responder, IncidentResponder):
            raise TypeError("responder must be an IncidentResponder")
        self.responder = responder
        self._agent_tools = {t.name: t for t in tools}   # not `tools`: that attribute registers middleware tools
        self.stop_reason: str | None = None
        self.log: list[dict[str, Any]] = []
        self._lock = threading.Lock()                    # one tool call through AIR at a time (sync path)
        self._alock: asyncio.Lock | None = None          # the same for the async path, made in its event loop
        self._loop: asyncio.AbstractEventLoop | None = None

    def _execute(self, call: ToolCall) -> Any:
        if call.name not in self._agent_tools:
            raise KeyError(f"recovery tool {call.name!r} is not one of the agent's tools")
        tool = self._agent_tools[call.name]
        loop = self._loop
        if loop is not None and getattr(tool, "func", None) is None and getattr(tool, "coroutine", None):
            # an async-only tool, called from AIR's worker thread: run it on the agent's event loop
            return asyncio.run_coroutine_threadsafe(tool.ainvoke(dict(call.args)), loop).result()
        return tool.invoke(dict(call.args))

    # -- hooks (sync) -------------------------------------------------------------------------------------
    def before_agent(self, state: Any, runtime: Any) -> dict[str, Any] | None:
        task = next((_text(m.content) for m in state["messages"] if isinstance(m, HumanMessage)), "")
        self.stop_reason = None
        self.responder.begin(task, executor=self._execute)
        return None

    @hook_config(can_jump_to=["end"])
    def before_model(self, state: Any, runtime: Any) -> dict[str, Any] | None:
        if self.stop_reason is None:
            d = self.responder.before_step()
            if d.kind == "stop":
                self.stop_reason = d.message or "stopped by AIR"
        if self.stop_reason is not None:
            return {"messages": [AIMessage(f"[AIR] The run was stopped: {self.stop_reason}")], "jump_to": "end"}
        return None

    def wrap_tool_call(self, request: Any, handler: Callable[[Any], Any]) -> Any:
        with self._lock:
            call, early = self._before_tool(request)
            if early is not None:
                return early
            try:
                out = handler(request)
            except Exception as exc:       # a raising tool: contained, shown to AIR and the model as an error
                out = self._tool_error(request, exc)
            return self._after_tool(request, call, out)

    def after_agent(self, state: Any, runtime: Any) -> dict[str, Any] | None:
        self.responder.finish()
        return None

    # -- hooks (async) ------------------------------------------------------------------------------------
    async def abefore_agent(self, state: Any, runtime: Any) -> dict[str, Any] | None:
        self._loop = asyncio.get_running_loop()
        self._alock = asyncio.Lock()
        return await asyncio.to_thread(self.before_agent, state, runtime)

    @hook_config(can_jump_to=["end"])
    async def abefore_model(self, state: Any, runtime: Any) -> dict[str, Any] | None:
        return await asyncio.to_thread(self.before_model, state, runtime)

    async def awrap_tool_call(self, request: Any, handler: Callable[[Any], Awaitable[Any]]) -> Any:
        if self._alock is None:
            self._alock = asyncio.Lock()
        self._loop = asyncio.get_running_loop()
        async with self._alock:
            call, early = await asyncio.to_thread(self._before_tool, request)
            if early is not None:
                return early
            try:
                out = await handler(request)
            except Exception as exc:       # a raising tool: contained, shown to AIR and the model as an error
                out = self._tool_error(request, exc)
            return await asyncio.to_thread(self._after_tool, request, call, out)

    async def aafter_agent(self, state: Any, runtime: Any) -> dict[str, Any] | None:
        return await asyncio.to_thread(self.after_agent, state, runtime)

    # -- the decisions around one tool call ----------------------------------------------------------------
    def _before_tool(self, request: Any) -> tuple[ToolCall, Any]:
        """``(call, None)`` to run the tool, or ``(call, ToolMessage)`` when AIR blocks or stops it."""
        tc = request.tool_call
        call = ToolCall(tc["name"], dict(tc.get("args") or {}))
        d = self.responder.before_action(call)
        self.log.append({"tool": call.name, "before": d.kind})
        if d.kind in ("block", "stop"):
            if d.kind == "stop":
                self.stop_reason = d.message or "stopped by AIR"
            return call, ToolMessage(f"[AIR] {d.message or 'blocked'}", tool_call_id=tc["id"], name=call.name,
                                     status="error")
        return call, None

    @staticmethod
    def _tool_error(request: Any, exc: Exception) -> Any:
        tc = request.tool_call
        return ToolMessage(f"tool error: {type(exc).__name__}: {exc}", tool_call_id=tc["id"], name=tc["name"],
                           status="error")

    def _after_tool(self, request: Any, call: ToolCall, out: Any) -> Any:
        tc = request.tool_call
        result = _text(out.content) if isinstance(out, ToolMessage) else str(out)
        d = self.responder.after_action(call, result)
        self.log[-1]["after"] = d.kind
        if d.kind == "stop":
            self.stop_reason = d.message or "stopped by AIR"
        if d.kind in ("block", "stop"):
            return ToolMessage(f"[AIR] {d.message}", tool_call_id=tc["id"], name=call.name, status="error")
        if d.kind == "guide" and isinstance(out, ToolMessage):
            extra = "\n".join(d.messages)
            return ToolMessage(f"{_text(out.content)}\n[AIR guidance] {extra}", tool_call_id=tc["id"],
                               name=call.name, status=out.status)
        return out
