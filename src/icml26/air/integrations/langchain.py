"""AIR's integrations layer, LangChain: AIR as agent middleware.

For ``langchain`` 1.x ``create_agent(..., middleware=[...])``.

**One episode per run, one per thread.** Every agent run (an ``invoke``/``ainvoke``/``stream`` call) has an
:class:`Episode` of its own: ``before_agent`` opens it under a fresh key, which travels with the run in a private
state field (``air_episode``: never part of the agent's input or output), so concurrent runs on one agent never
share one, and every later hook of the run finds its own. The task of the run is the latest human message of the
run's state: with a checkpointer, the request of the current turn (earlier turns' messages are history).
``after_agent`` finishes the run (end-of-episode rules and eradication of the run's incidents). A run whose key is
unknown (resumed after an interrupt in another process) opens its episode on first use.

A run without a ``thread_id`` is a responder episode of its own, on a fresh shallow copy of the ``responder``
given. The turns of a checkpointed thread (a run whose ``execution_info`` has a ``thread_id``) are one responder
episode, the conversation's: the thread's first turn opens it on a fresh copy (``begin``), and each later turn
continues it on the same copy with :meth:`~icml26.air.runtime.responder.IncidentResponder.retask` (the turn's
request as the task). So what earlier turns' tool outputs brought in is still tainted in the next turn (an address
injected into a page read in turn 1 is flagged when the agent sends to it in turn 2), their containment
(quarantined tools, blocked calls, containment rules) still holds, and the entities the user named in any turn of
the thread count as the user's; ``ctx.user_task`` is the current turn's request, and each turn's incidents are
finished at the end of that turn. A new turn that begins while an earlier run of its thread is still open
(interrupted, never resumed) finishes that run first. The threads' responders are kept in a least-recently-used
map of ``MAX_THREAD_EPISODES``: a thread dropped from it begins afresh at its next turn. A thread's turns are
expected one after another (as LangGraph runs them); concurrent runs on one thread share its episode.

Each episode runs on a shallow copy of the ``responder`` given, which therefore serves as the template: its
rules, state provider, manifest and settings are shared, as are ``incidents``, ``rule_store`` (eradicated rules
learned by one run protect the next), ``timings``, ``check_errors`` and the incident log; the per-episode context
(task, taint, trace, quarantine) is the episode's own.

Hook mapping:

- ``before_agent``: a new run's episode (``begin``, or ``retask`` for a later turn of a thread); the task is the
  latest human message.
- ``before_model``: ``before_step()``; a stop (or an earlier stop of this run) ends the run with an AI message
  saying why (``jump_to="end"``).
- ``wrap_tool_call``: ``before_action`` (a block answers the model with an error ``ToolMessage`` instead of running
  the tool); the tool runs (an exception becomes an error ``ToolMessage``, also shown to AIR); ``after_action`` (a
  block replaces the output with AIR's message; guidance is appended to the output for the model to act on; direct
  recovery runs the agent's own tools).
- ``after_agent``: ``finish()`` of the run's episode.

Every hook has its async twin (``abefore_agent``, ``abefore_model``, ``awrap_tool_call``, ``aafter_agent``), so
``agent.ainvoke`` / ``agent.astream`` work: AIR's checks run in a worker thread (a state provider may block),
the tool itself is awaited, and direct recovery awaits async-only tools on the run's event loop. Tool calls pass
through AIR one at a time, across the runs of the agent too (a lock around before-action, the tool and
after-action), so each action is judged on the state it found and left, even when several tool calls or runs
are in flight at once.

Example:
    >>> from langchain_core.tools import tool
    >>> from icml26.air import DictState, IncidentResponder, parse
    >>> @tool
    ... def delete(path: str) -> str:
    ...     '''Delete a file.'''
    ...     return "deleted"
    >>> rules = parse('rule r on before_action(delete) detect : call.args.path == "/etc" contain - block end')
    >>> mw = AIRMiddleware(IncidentResponder(rules, DictState(dict)), tools=[delete])
    >>> type(mw).__name__, mw.episodes, len(mw.threads)
    ('AIRMiddleware', {}, 0)
"""

from __future__ import annotations

import asyncio
import copy
import threading
import uuid
import weakref
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, NotRequired

from ...common.optional import requires
from ..core.records import Incident, ToolCall
from ..runtime.responder import IncidentResponder

requires("langchain", extra="agents-langchain", purpose="the AIR LangChain middleware")

from langchain.agents.middleware import AgentMiddleware, AgentState, hook_config  # noqa: E402
from langchain.agents.middleware.types import PrivateStateAttr  # noqa: E402
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage  # noqa: E402

#: the private state field carrying a run's episode key
EPISODE_KEY = "air_episode"
#: open episodes kept at most (runs interrupted and never resumed); past it the oldest is finished
MAX_OPEN_EPISODES = 256
#: checkpointed threads whose episode (responder) is kept, the least recently used dropped past it
MAX_THREAD_EPISODES = 256


class AIRState(AgentState):
    """The agent state with the run's AIR episode key (private: omitted from the agent's input and output)."""

    air_episode: Annotated[NotRequired[str | None], PrivateStateAttr]


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(c.get("text", "") if isinstance(c, dict) else str(c) for c in content)
    return str(content)


def _latest_task(state: Any) -> str:
    """The latest human message of the run's state: the current request (with a checkpointer, of this turn)."""
    messages = _get(state, "messages") or []
    return next((_text(m.content) for m in reversed(messages) if isinstance(m, HumanMessage)), "")


def _get(state: Any, key: str) -> Any:
    return state.get(key) if isinstance(state, Mapping) else getattr(state, key, None)


@dataclass
class Episode:
    """One run's AIR episode (with a checkpointer, one turn of its thread's episode).

    Attributes:
        key: the run's episode key (its ``air_episode`` state field).
        task: the user's task the run is judged under.
        responder: the episode's responder (a copy of the middleware's template; the thread's, shared by its
            turns, with a checkpointer).
        thread_id: the run's ``configurable.thread_id`` (None without a checkpointer).
        run_id: the run id given in the run's config (None when none was given).
        stop_reason: why AIR stopped the run (None: not stopped).
        finished: whether ``finish()`` has run.
        incidents: the episode's incidents, set when it finishes (the end-of-episode ones included).
        loop: the event loop of an async run (direct recovery awaits async-only tools on it).
    """

    key: str | None
    task: str
    responder: IncidentResponder
    thread_id: str | None = None
    run_id: str | None = None
    stop_reason: str | None = None
    finished: bool = False
    incidents: tuple[Incident, ...] = ()
    loop: asyncio.AbstractEventLoop | None = None


class AIRMiddleware(AgentMiddleware):
    """Runs an :class:`~icml26.air.runtime.responder.IncidentResponder` inside a LangChain agent, one episode per run.

    Args:
        responder: the AIR runtime, the template of every run's episode (see the module docstring); its ``state``
            provider reads the environment the tools act on.
        tools: the agent's tools, used as the executor of direct recovery calls.

    Attributes:
        episodes: the open episodes by key (runs in flight).
        finished: the last finished episodes, oldest first (up to ``MAX_OPEN_EPISODES``).
        threads: the checkpointed threads' responders by ``thread_id``, least recently used first (up to
            ``MAX_THREAD_EPISODES``).
        log: one entry per tool call: ``tool``, ``before``/``after`` decisions, ``episode`` key.
    """

    state_schema = AIRState

    def __init__(self, responder: IncidentResponder, tools: Sequence[Any] = ()):
        super().__init__()
        if not isinstance(responder, IncidentResponder):
            raise TypeError("responder must be an IncidentResponder")
        self.responder = responder
        self._agent_tools = {t.name: t for t in tools}   # not `tools`: that attribute registers middleware tools
        self.episodes: dict[str | None, Episode] = {}
        self.finished: deque[Episode] = deque(maxlen=MAX_OPEN_EPISODES)
        self.threads: OrderedDict[Any, IncidentResponder] = OrderedDict()
        self.log: list[dict[str, Any]] = []
        self._lock = threading.Lock()                    # one tool call through AIR at a time (sync path)
        self._guard = threading.RLock()                  # one responder call at a time (shared rules, evaluator)
        # the same for the async path, one lock per event loop (made in it)
        self._alocks: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Lock] = \
            weakref.WeakKeyDictionary()

    # -- episodes -----------------------------------------------------------------------------------------
    def _open(self, key: str | None, state: Any, runtime: Any, loop: asyncio.AbstractEventLoop | None) -> Episode:
        info = getattr(runtime, "execution_info", None)
        thread = getattr(info, "thread_id", None)
        with self._guard:
            # a later turn of a checkpointed thread continues the thread's episode; any other run begins one
            ongoing = self.threads.get(thread) if thread is not None else None
            ep = Episode(key, _latest_task(state), ongoing if ongoing is not None else copy.copy(self.responder),
                         thread_id=thread, run_id=getattr(info, "run_id", None), loop=loop)
            if ongoing is None:
                ep.responder.begin(ep.task, executor=lambda call: self._execute(call, ep))
            else:
                for k in [k for k, e in self.episodes.items() if e.responder is ongoing]:
                    self._close(k)                           # an earlier run of the thread left open: finished
                ep.responder.retask(ep.task, executor=lambda call: self._execute(call, ep))
            if thread is not None:
                self.threads[thread] = ep.responder
                self.threads.move_to_end(thread)
                while len(self.threads) > MAX_THREAD_EPISODES:  # the least recently used thread begins afresh
                    self.threads.popitem(last=False)
            self.episodes[key] = ep
            while len(self.episodes) > MAX_OPEN_EPISODES:    # runs never resumed: the oldest is finished
                self._close(next(iter(self.episodes)))
        return ep

    def _episode(self, state: Any, runtime: Any = None, loop: asyncio.AbstractEventLoop | None = None) -> Episode:
        """The run's episode (opened on first use when the run's key is not one of the open episodes)."""
        key = _get(state, EPISODE_KEY)
        ep = self.episodes.get(key)
        if ep is None:
            ep = self._open(key, state, runtime, loop)
        if loop is not None:
            ep.loop = loop
        return ep

    def _close(self, key: str | None) -> Episode | None:
        """Finish the episode ``key`` (once) and move it to ``finished``."""
        with self._guard:
            ep = self.episodes.pop(key, None)
            if ep is None or ep.finished:
                return ep
            ep.incidents = tuple(ep.responder.finish())
            ep.finished = True
            self.finished.append(ep)
            return ep

    def _execute(self, call: ToolCall, ep: Episode) -> Any:
        if call.name not in self._agent_tools:
            raise KeyError(f"recovery tool {call.name!r} is not one of the agent's tools")
        tool = self._agent_tools[call.name]
        loop = ep.loop
        if loop is not None and getattr(tool, "func", None) is None and getattr(tool, "coroutine", None):
            # an async-only tool, called from AIR's worker thread: run it on the run's event loop
            return asyncio.run_coroutine_threadsafe(tool.ainvoke(dict(call.args)), loop).result()
        return tool.invoke(dict(call.args))

    # -- hooks (sync) -------------------------------------------------------------------------------------
    def before_agent(self, state: Any, runtime: Any) -> dict[str, Any] | None:
        return self._begin(state, runtime, None)

    def _begin(self, state: Any, runtime: Any, loop: asyncio.AbstractEventLoop | None) -> dict[str, Any]:
        key = uuid.uuid4().hex
        self._open(key, state, runtime, loop)
        return {EPISODE_KEY: key}

    @hook_config(can_jump_to=["end"])
    def before_model(self, state: Any, runtime: Any) -> dict[str, Any] | None:
        return self._before_model(self._episode(state, runtime))

    def _before_model(self, ep: Episode) -> dict[str, Any] | None:
        if ep.stop_reason is None:
            with self._guard:
                d = ep.responder.before_step()
            if d.kind == "stop":
                ep.stop_reason = d.message or "stopped by AIR"
        if ep.stop_reason is not None:
            return {"messages": [AIMessage(f"[AIR] The run was stopped: {ep.stop_reason}")], "jump_to": "end"}
        return None

    def wrap_tool_call(self, request: Any, handler: Callable[[Any], Any]) -> Any:
        ep = self._episode(request.state, getattr(request, "runtime", None))
        with self._lock:
            call, early = self._before_tool(ep, request)
            if early is not None:
                return early
            try:
                out = handler(request)
            except Exception as exc:       # a raising tool: contained, shown to AIR and the model as an error
                out = self._tool_error(request, exc)
            return self._after_tool(ep, request, call, out)

    def after_agent(self, state: Any, runtime: Any) -> dict[str, Any] | None:
        self._close(_get(state, EPISODE_KEY))
        return None

    # -- hooks (async) ------------------------------------------------------------------------------------
    def _alock(self) -> asyncio.Lock:
        loop = asyncio.get_running_loop()
        lock = self._alocks.get(loop)
        if lock is None:
            lock = self._alocks[loop] = asyncio.Lock()
        return lock

    async def abefore_agent(self, state: Any, runtime: Any) -> dict[str, Any] | None:
        return await asyncio.to_thread(self._begin, state, runtime, asyncio.get_running_loop())

    @hook_config(can_jump_to=["end"])
    async def abefore_model(self, state: Any, runtime: Any) -> dict[str, Any] | None:
        ep = self._episode(state, runtime, asyncio.get_running_loop())
        return await asyncio.to_thread(self._before_model, ep)

    async def awrap_tool_call(self, request: Any, handler: Callable[[Any], Awaitable[Any]]) -> Any:
        ep = self._episode(request.state, getattr(request, "runtime", None), asyncio.get_running_loop())
        async with self._alock():
            call, early = await asyncio.to_thread(self._before_tool, ep, request)
            if early is not None:
                return early
            try:
                out = await handler(request)
            except Exception as exc:       # a raising tool: contained, shown to AIR and the model as an error
                out = self._tool_error(request, exc)
            return await asyncio.to_thread(self._after_tool, ep, request, call, out)

    async def aafter_agent(self, state: Any, runtime: Any) -> dict[str, Any] | None:
        await asyncio.to_thread(self._close, _get(state, EPISODE_KEY))
        return None

    # -- the decisions around one tool call ----------------------------------------------------------------
    def _before_tool(self, ep: Episode, request: Any) -> tuple[ToolCall, Any]:
        """``(call, None)`` to run the tool, or ``(call, ToolMessage)`` when AIR blocks or stops it."""
        tc = request.tool_call
        call = ToolCall(tc["name"], dict(tc.get("args") or {}))
        with self._guard:
            d = ep.responder.before_action(call)
            self.log.append({"tool": call.name, "before": d.kind, "episode": ep.key})
        if d.kind in ("block", "stop"):
            if d.kind == "stop":
                ep.stop_reason = d.message or "stopped by AIR"
            return call, ToolMessage(f"[AIR] {d.message or 'blocked'}", tool_call_id=tc["id"], name=call.name,
                                     status="error")
        return call, None

    @staticmethod
    def _tool_error(request: Any, exc: Exception) -> Any:
        tc = request.tool_call
        return ToolMessage(f"tool error: {type(exc).__name__}: {exc}", tool_call_id=tc["id"], name=tc["name"],
                           status="error")

    def _after_tool(self, ep: Episode, request: Any, call: ToolCall, out: Any) -> Any:
        tc = request.tool_call
        result = _text(out.content) if isinstance(out, ToolMessage) else str(out)
        with self._guard:
            d = ep.responder.after_action(call, result)
            entry = next((e for e in reversed(self.log) if e["episode"] == ep.key and "after" not in e), None)
            if entry is not None:
                entry["after"] = d.kind
        if d.kind == "stop":
            ep.stop_reason = d.message or "stopped by AIR"
        if d.kind in ("block", "stop"):
            return ToolMessage(f"[AIR] {d.message}", tool_call_id=tc["id"], name=call.name, status="error")
        if d.kind == "guide" and isinstance(out, ToolMessage):
            extra = "\n".join(d.messages)
            return ToolMessage(f"{_text(out.content)}\n[AIR guidance] {extra}", tool_call_id=tc["id"],
                               name=call.name, status=out.status)
        return out
