"""AIR's integrations layer, MCP: a proxy enforcing AIR rules in front of another MCP server's tools.

Any MCP client can use it.

The proxy connects to the upstream server (stdio), lists its tools and resources as its own, and on every
``tools/call``: refreshes the state view, runs ``before_action`` (a block answers with an error result and the
upstream tool never runs), forwards the call, refreshes the state, runs ``after_action`` (a block replaces the
output with AIR's message), and carries out the recovery calls of the decision on the upstream server itself, each
distinct call once (they are AIR's own calls, like direct recovery: no rule judges them; with a manifest only its
declared inverses are issued), and verifies them on the refreshed state at the next hook or the episode's end. A failing upstream call, a malformed result or an exception inside
AIR's hooks is answered with an error result and logged: the proxy fails closed, it never forwards a call it could
not check. Calls pass through AIR one at a time (each is judged on the state it found and left).

**The user's task** (what context rules such as ``named_by_user(ctx.user_task, ...)`` read) comes from the client,
in the request's ``_meta`` under :data:`TASK_META_KEY` (``"air/task"``), e.g. with the ``mcp`` package's client
``session.call_tool("share", args, meta={"air/task": "share notes.md with bob@corp.com"})``. It holds for that
call and the session's later calls, until a call carries another one: each new task is a new episode (the previous
one is finished: end-of-episode rules, eradication). ``--task`` is the task until a client sends one. A task that
is not a string is refused (error result; the call is not run).

**The state** rules read as ``state`` is the JSON object in the text of one upstream resource (``--state-uri``,
default :data:`STATE_URI`, ``state://view``), read before and after every call and after every recovery call. A
server without it gives rules an empty state; with ``--state-uri`` given, a server without it is an error at start.
An unreadable or non-object state is logged and the last good view is kept.

**Rules and manifest**: ``--rules`` is a rule file or the name of a rule set shipped in ``air/rules`` (``generic``:
the rules written once over a tool manifest's effect classes); ``--manifest`` is a tool manifest file
(:mod:`~icml26.air.policy.manifest_file`), which the generic rules need (effects, targets, ``undo``). With a
manifest, recovery calls only the inverse operations it declares.

Run: ``icml26 air proxy [--rules FILE|NAME] [--manifest FILE] [--task TEXT] [--state-uri URI] [--log FILE] -- COMMAND
ARGS...`` (stdio on both sides).

Example:
    >>> from icml26.air import DictState, IncidentResponder, parse
    >>> proxy = AIRProxy(["python", "-m", "server"], IncidentResponder(parse(
    ...     'rule r on before_action(delete) detect : call.args.path == "x" contain - block end'), DictState(dict)))
    >>> proxy.command, proxy.state_uri
    (['python', '-m', 'server'], 'state://view')
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ...common.optional import requires
from ..core.records import ToolCall
from ..runtime.responder import IncidentResponder
from ..runtime.state import DictState

requires("mcp", extra="agents-mcp", purpose="the AIR MCP proxy")

import mcp.types as types  # noqa: E402
from mcp import ClientSession, StdioServerParameters, stdio_client  # noqa: E402
from mcp.server.lowlevel import Server  # noqa: E402
from mcp.shared.exceptions import MCPError  # noqa: E402

#: the default upstream resource holding the state view (JSON object as text)
STATE_URI = "state://view"
#: the ``_meta`` key of a request carrying the user's task
TASK_META_KEY = "air/task"


class ProxyStartError(RuntimeError):
    """The proxy could not start (the upstream server, its state resource)."""


def _text_of(result: Any) -> str:
    parts = []
    for c in getattr(result, "content", None) or []:
        parts.append(getattr(c, "text", None) or json.dumps(c.model_dump() if hasattr(c, "model_dump") else str(c)))
    return "\n".join(parts)


def _error(text: str) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)], is_error=True)


class AIRProxy:
    """An AIR-enforcing MCP server in front of ``command`` (an MCP server over stdio).

    Args:
        command: the upstream server's command line.
        responder: the AIR runtime; its state provider is replaced by the upstream state view.
        user_task: the task until a client sends one (``_meta`` ``air/task``; see the module docstring).
        call_timeout: seconds per upstream call.
        state_uri: the upstream resource holding the state view.
        require_state: refuse to start when the upstream server does not offer ``state_uri``.

    Attributes:
        task: the current episode's task.
        episodes: the finished episodes, ``{"task": ..., "incidents": [rule names]}``, oldest first.
        log: the proxy's events (decisions, upstream and state errors, episodes).
    """

    def __init__(self, command: Sequence[str], responder: IncidentResponder, *, user_task: str = "",
                 call_timeout: float = 30.0, state_uri: str = STATE_URI, require_state: bool = False):
        if not command:
            raise ValueError("command must name the upstream MCP server to start")
        self.command = list(command)
        self.responder, self.user_task, self.timeout = responder, user_task, call_timeout
        self.state_uri, self.require_state = state_uri, require_state
        self.view: dict[str, Any] = {}
        self.responder.state = DictState(lambda: self.view)
        self.responder.recovery_mode = "guided"          # the proxy itself carries out the recovery calls
        self.responder.mode = "guided"
        self.upstream: ClientSession | None = None
        self.has_state = False
        self.task = user_task
        self.episode_open = False
        self.episodes: list[dict[str, Any]] = []
        self.log: list[dict[str, Any]] = []
        self._lock: asyncio.Lock | None = None

    # -- episodes -----------------------------------------------------------------------------------------
    def begin(self, task: str) -> None:
        """Start an episode for ``task`` (finishing the open one)."""
        self.finish()
        self.responder.begin(task)
        self.task, self.episode_open = task, True
        self.log.append({"event": "episode", "task": task})

    def finish(self) -> None:
        """Finish the open episode, if any (once)."""
        if not self.episode_open:
            return
        self.episode_open = False
        incidents = self.responder.finish()
        self.episodes.append({"task": self.task, "incidents": [i.rule for i in incidents]})

    # -- upstream -----------------------------------------------------------------------------------------
    async def _read_state(self) -> dict[str, Any]:
        assert self.upstream is not None
        res = await self.upstream.read_resource(self.state_uri)
        view = json.loads(res.contents[0].text)
        if not isinstance(view, dict):
            raise TypeError(f"{self.state_uri} holds a {type(view).__name__}, not a JSON object")
        return view

    async def _refresh(self) -> None:
        if not self.has_state or self.upstream is None:
            return
        try:
            self.view = await self._read_state()
        except Exception as exc:                          # an unreadable state: rules see the last good view
            self.log.append({"event": "state_error", "error": f"{type(exc).__name__}: {exc}"})

    async def _forward(self, name: str, args: dict[str, Any]) -> tuple[types.CallToolResult, str]:
        assert self.upstream is not None
        try:
            result = await self.upstream.call_tool(name, args, read_timeout_seconds=self.timeout)
            if not isinstance(result, types.CallToolResult):
                raise TypeError(f"malformed upstream result: {type(result).__name__}")
            return result, _text_of(result)
        except Exception as exc:
            self.log.append({"event": "upstream_error", "tool": name, "error": f"{type(exc).__name__}: {exc}"})
            err = _error(f"upstream tool {name} failed: {type(exc).__name__}: {exc}")
            return err, _text_of(err)

    # -- one call -----------------------------------------------------------------------------------------
    async def call_tool(self, name: str, args: dict[str, Any], *, task: Any = None) -> types.CallToolResult:
        """AIR around one upstream tool call (the proxy's ``tools/call`` handler); ``task``: the client's task for
        this call and the later ones (None: the current one)."""
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            if task is not None and not isinstance(task, str):
                self.log.append({"event": "bad_task", "tool": name})
                return _error(f"[AIR] _meta {TASK_META_KEY!r} must be a string; the call was not run")
            if task is not None and (task != self.task or not self.episode_open):
                try:
                    await self._refresh()
                    self.begin(task)
                except Exception as exc:                  # fail closed
                    self.log.append({"event": "air_error", "tool": name, "error": f"{type(exc).__name__}: {exc}"})
                    return _error(f"[AIR] the task could not be set ({type(exc).__name__}); the call was not run")
            return await self._call(name, args)

    async def _call(self, name: str, args: dict[str, Any]) -> types.CallToolResult:
        call = ToolCall(name, dict(args or {}))
        try:
            await self._refresh()
            self.responder.before_step()
            d = self.responder.before_action(call)
        except Exception as exc:                          # fail closed
            self.log.append({"event": "air_error", "tool": name, "error": f"{type(exc).__name__}: {exc}"})
            return _error(f"[AIR] the call could not be checked ({type(exc).__name__}); it was not run")
        self.log.append({"event": "before_action", "tool": name, "decision": d.kind})
        if d.kind in ("block", "stop"):
            return _error(f"[AIR] {d.message or 'blocked'}")
        result, text = await self._forward(name, call.args)
        try:
            await self._refresh()
            d = self.responder.after_action(call, text)
            done: set[str] = set()
            for rc in d.recovery_calls:      # AIR's own calls (declared inverses with a manifest): each runs once
                sig = json.dumps([rc.name, rc.args], sort_keys=True, default=str)
                if sig in done:
                    continue
                done.add(sig)
                _, rtext = await self._forward(rc.name, dict(rc.args))
                self.log.append({"event": "recovery", "tool": rc.name, "issued_by": rc.issued_by, "result": rtext})
            if done:
                await self._refresh()        # verified on this state at the next hook (or the episode's end)
        except Exception as exc:
            self.log.append({"event": "air_error", "tool": name, "error": f"{type(exc).__name__}: {exc}"})
            return _error(f"[AIR] the result could not be checked ({type(exc).__name__}); it is withheld")
        self.log.append({"event": "after_action", "tool": name, "decision": d.kind,
                         "recovered": [rc.name for rc in d.recovery_calls]})
        if d.kind in ("block", "stop"):
            return _error(f"[AIR] {d.message}")
        if d.kind == "guide":        # structured content, metadata and the error flag pass through unchanged
            result = result.model_copy(update={"content": [*result.content, types.TextContent(
                type="text", text="[AIR guidance] " + " ".join(d.messages))]})
        return result

    def server(self) -> Server:
        """The proxy as a low-level MCP server (tools and resources forwarded)."""

        async def list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
            assert self.upstream is not None
            return await self.upstream.list_tools()

        async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
            meta = params.meta if params.meta is not None else getattr(ctx, "meta", None)
            task = meta.get(TASK_META_KEY) if isinstance(meta, Mapping) else None
            return await self.call_tool(params.name, dict(params.arguments or {}), task=task)

        async def list_resources(ctx: Any, params: Any) -> types.ListResourcesResult:
            assert self.upstream is not None
            return await self.upstream.list_resources()

        async def read_resource(ctx: Any, params: types.ReadResourceRequestParams) -> types.ReadResourceResult:
            assert self.upstream is not None
            return await self.upstream.read_resource(params.uri)

        return Server("icml26-air-proxy", on_list_tools=list_tools, on_call_tool=call_tool,
                      on_list_resources=list_resources, on_read_resource=read_resource)

    async def _offers_state(self, session: ClientSession) -> bool:
        try:
            resources = await session.list_resources()
            if any(str(r.uri) == self.state_uri for r in resources.resources):
                return True
        except MCPError:                           # the upstream server has no resources capability
            return False
        try:                                       # not listed: a resource template may still serve it
            await self._read_state()
            return True
        except Exception:
            return False

    @contextlib.asynccontextmanager
    async def connected(self) -> Any:
        """Start and initialise the upstream server; an episode begins with ``user_task``."""
        # the upstream server inherits the proxy's environment (the client that started the proxy chose it)
        params = StdioServerParameters(command=self.command[0], args=self.command[1:], env=dict(os.environ))
        async with stdio_client(params, errlog=_errlog()) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            self.upstream = session
            self.has_state = await self._offers_state(session)
            if self.require_state and not self.has_state:
                raise ProxyStartError(f"the upstream server offers no state resource {self.state_uri}")
            await self._refresh()
            self.begin(self.user_task)
            try:
                yield self
            finally:
                self.finish()
                self.upstream = None

    async def serve_stdio(self) -> None:
        """Serve MCP clients on stdin/stdout until they disconnect."""
        from mcp.server.stdio import stdio_server

        async with self.connected():
            server = self.server()
            async with stdio_server() as (read, write):
                await server.run(read, write, server.create_initialization_options())


def _errlog() -> Any:
    """Where the upstream server's stderr goes: the current ``sys.stderr`` when it is a file (not a capture)."""
    try:
        sys.stderr.fileno()
        return sys.stderr
    except (AttributeError, ValueError, io.UnsupportedOperation):
        return sys.__stderr__


def builtin_rule_sets() -> list[str]:
    """The names of the rule files shipped in ``air/rules`` (``--rules NAME``)."""
    from importlib.resources import files

    return sorted(p.name[:-4] for p in (files("icml26.air") / "rules").iterdir() if p.name.endswith(".air"))


def load_rules(spec: str | Path) -> Any:
    """``--rules``: a rule file, or the name of a rule set shipped in ``air/rules`` (a file of that name wins)."""
    from ..dsl import load
    from ..policy.rules import builtin_rules

    if Path(spec).is_file():
        return load(spec)
    if str(spec) in builtin_rule_sets():
        return builtin_rules(str(spec))
    raise ValueError(f"no such rule file or built-in rule set: {spec} (built-in: {', '.join(builtin_rule_sets())})")


def _leaf(exc: BaseException) -> BaseException:
    """The first exception inside (nested) exception groups: the one worth a line."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


def main(rules_path: str, command: Sequence[str], user_task: str = "", log_path: str | None = None, *,
         llm: Any = None, manifest: str | None = None, state_uri: str | None = None, debug: bool = False) -> int:
    """``icml26 air proxy`` entry point; ``llm`` (an :class:`~icml26.air.runtime.llm.LLMClient`) answers ``semantic``.

    Raises ``ValueError``/``RuleSyntaxError`` for bad rules or a bad manifest; a proxy that cannot start (the
    upstream command, its state resource) is one line on stderr and exit status 1 (``debug``: the traceback).
    """
    import anyio

    from ..policy.manifest_file import load_manifest
    from ..runtime.llm import LLMSemantic

    responder = IncidentResponder(load_rules(rules_path), DictState(dict), log_path=log_path,
                                  manifest=load_manifest(manifest) if manifest is not None else None,
                                  semantic=LLMSemantic(llm) if llm is not None else None)
    proxy = AIRProxy(command, responder, user_task=user_task, state_uri=state_uri or STATE_URI,
                     require_state=state_uri is not None)
    try:
        anyio.run(proxy.serve_stdio)
    except KeyboardInterrupt:  # pragma: no cover
        return 130
    except Exception as exc:
        if debug:
            raise
        leaf = _leaf(exc)
        what = str(leaf) if isinstance(leaf, ProxyStartError) else f"{type(leaf).__name__}: {leaf}"
        print(f"error: the proxy for upstream {' '.join(command)!r} stopped: {' '.join(what.split())}", file=sys.stderr)
        return 1
    print(json.dumps({"incidents": [i.record() for i in responder.incidents],
                      "episodes": proxy.episodes}, default=str), file=sys.stderr)
    return 0
