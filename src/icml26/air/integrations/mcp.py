"""AIR's integrations layer, MCP: a proxy enforcing AIR rules in front of another MCP server's tools.

Any MCP client can use it.

The proxy connects to the upstream server (stdio), lists its tools and resources as its own, and on every
``tools/call``: refreshes the state view (the upstream resource ``state://view`` if it has one), runs
``before_action`` (a block answers with an error result and the upstream tool never runs), forwards the call,
refreshes the state, runs ``after_action`` (a block replaces the output with AIR's message), and carries out
recovery calls on the upstream server itself (AIR-tagged; their verification happens on the refreshed state).
A failing upstream call, a malformed result or an exception inside AIR's hooks is answered with an error result
and logged: the proxy fails closed, it never forwards a call it could not check.

Run: ``icml26 air proxy --rules FILE [--task TEXT] -- COMMAND ARGS...`` (stdio on both sides).

Example:
    >>> from icml26.air import DictState, IncidentResponder, parse
    >>> proxy = AIRProxy(["python", "-m", "server"], IncidentResponder(parse(
    ...     'rule r on before_action(delete) detect : call.args.path == "x" contain - block end'), DictState(dict)))
    >>> proxy.command
    ['python', '-m', 'server']
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Sequence
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

STATE_URI = "state://view"


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
        user_task: the user's task for context rules (MCP carries none).
        call_timeout: seconds per upstream call.
    """

    def __init__(self, command: Sequence[str], responder: IncidentResponder, *, user_task: str = "",
                 call_timeout: float = 30.0):
        if not command:
            raise ValueError("command must name the upstream MCP server to start")
        self.command = list(command)
        self.responder, self.user_task, self.timeout = responder, user_task, call_timeout
        self.view: dict[str, Any] = {}
        self.responder.state = DictState(lambda: self.view)
        self.responder.recovery_mode = "guided"          # the proxy itself carries out the recovery calls
        self.responder.mode = "guided"
        self.upstream: ClientSession | None = None
        self.has_state = False
        self.log: list[dict[str, Any]] = []

    async def _refresh(self) -> None:
        if not self.has_state or self.upstream is None:
            return
        try:
            res = await self.upstream.read_resource(STATE_URI)
            self.view = json.loads(res.contents[0].text)
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

    async def call_tool(self, name: str, args: dict[str, Any]) -> types.CallToolResult:
        """AIR around one upstream tool call (the proxy's ``tools/call`` handler)."""
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
            for rc in d.recovery_calls:
                self.responder.before_action(rc)
                _, rtext = await self._forward(rc.name, dict(rc.args))
                await self._refresh()
                self.responder.after_action(rc, rtext)
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
            return await self.call_tool(params.name, dict(params.arguments or {}))

        async def list_resources(ctx: Any, params: Any) -> types.ListResourcesResult:
            assert self.upstream is not None
            return await self.upstream.list_resources()

        async def read_resource(ctx: Any, params: types.ReadResourceRequestParams) -> types.ReadResourceResult:
            assert self.upstream is not None
            return await self.upstream.read_resource(params.uri)

        return Server("icml26-air-proxy", on_list_tools=list_tools, on_call_tool=call_tool,
                      on_list_resources=list_resources, on_read_resource=read_resource)

    @contextlib.asynccontextmanager
    async def connected(self) -> Any:
        """Start and initialise the upstream server; the responder begins an episode."""
        params = StdioServerParameters(command=self.command[0], args=self.command[1:])
        async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            self.upstream = session
            try:
                resources = await session.list_resources()
                self.has_state = any(str(r.uri) == STATE_URI for r in resources.resources)
            except MCPError:                       # the upstream server has no resources capability
                self.has_state = False
            await self._refresh()
            self.responder.begin(self.user_task)
            try:
                yield self
            finally:
                self.responder.finish()
                self.upstream = None

    async def serve_stdio(self) -> None:
        """Serve MCP clients on stdin/stdout until they disconnect."""
        from mcp.server.stdio import stdio_server

        async with self.connected():
            server = self.server()
            async with stdio_server() as (read, write):
                await server.run(read, write, server.create_initialization_options())


def main(rules_path: str, command: Sequence[str], user_task: str = "", log_path: str | None = None, *,
         llm: Any = None) -> int:
    """``icml26 air proxy`` entry point; ``llm`` (an :class:`~icml26.air.runtime.llm.LLMClient`) answers ``semantic``."""
    import anyio

    from ..dsl import load
    from ..runtime.llm import LLMSemantic

    responder = IncidentResponder(load(rules_path), DictState(dict), log_path=log_path,
                                  semantic=LLMSemantic(llm) if llm is not None else None)
    proxy = AIRProxy(command, responder, user_task=user_task)
    try:
        anyio.run(proxy.serve_stdio)
    except KeyboardInterrupt:  # pragma: no cover
        return 130
    print(json.dumps({"incidents": [i.record() for i in responder.incidents]}, default=str), file=sys.stderr)
    return 0
