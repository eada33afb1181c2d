"""AIR's integrations layer, the AgentDojo adapter: AIR inside AgentDojo's tool-execution loop.

- :class:`AIRToolsExecutor`: a drop-in for AgentDojo's ``ToolsExecutor`` that runs every tool call between
  ``before_action`` and ``after_action`` (a block answers with an error tool result; a stop aborts the run with
  AgentDojo's ``AbortAgentError``; ``ask_user`` asks ``confirm(call, env)``, and the call runs only when the user
  confirms it, withheld as a block otherwise or when there is no one to ask; direct recovery calls the suite's own
  functions on the same environment).
- :class:`AIRToolsExecutionLoop`: a drop-in for AgentDojo's ``ToolsExecutionLoop`` that finishes the episode of
  every :class:`AIRToolsExecutor` among its elements when the loop ends (returns or aborts): the end of the task
  run, so end-of-episode rules and eradication run without the harness calling ``finish()``::

      AgentPipeline([SystemMessage(...), InitQuery(), llm,
                     AIRToolsExecutionLoop([AIRToolsExecutor(responder), llm])])

An episode is one task run: it begins at the run's first tool calls (the task is the run's query) and is finished
once, by :meth:`AIRToolsExecutor.finish` (which the loop calls; calling it again does nothing). An executor reused
for the next task run (one pipeline for a whole benchmark) also finishes a run's episode left open when the next
run begins. Finish through the executor, never with ``responder.finish()`` as well: that would run the
end-of-episode rules twice.

The AIR state view is the environment's ``model_dump()`` with ``<list>_by_id`` maps added for lists of records
with an ``id`` (so rules can name a scheduled transaction by id); the adapter builds it with :class:`StateView`,
which after a call dumps again only the environment fields the tool can reach (its AgentDojo dependencies).
``BENCHMARK_VERSION`` is the AgentDojo release the adapter and the suites' manifests are written against;
``_fast_yaml`` makes AgentDojo load its task suites with libyaml's C loader.

The evaluation protocol (a scripted compromised agent, per-suite pair runs, AgentDojo's built-in attacks) is not
part of the adapter: it lives in the worlds layer (:mod:`icml26.air.worlds.agentdojo`).

Example:
    >>> AIRToolsExecutor(None).name
    'air-tools-executor'
    >>> AIRToolsExecutor(None).finish()
    []
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from ...common.optional import requires
from ..core.records import ToolCall
from ..runtime.responder import IncidentResponder
from ..runtime.state import DeferredView, DictState

requires("agentdojo", extra="agents-dojo", purpose="the AgentDojo integration")

from agentdojo.agent_pipeline.base_pipeline_element import BasePipelineElement  # noqa: E402
from agentdojo.agent_pipeline.errors import AbortAgentError  # noqa: E402
from agentdojo.agent_pipeline.tool_execution import ToolsExecutionLoop, tool_result_to_str  # noqa: E402
from agentdojo.functions_runtime import EmptyEnv  # noqa: E402
from agentdojo.types import ChatToolResultMessage, text_content_block_from_string  # noqa: E402

BENCHMARK_VERSION = "v1.2.1"


class _View(dict):
    """A ``model_dump`` dict whose lists of records also answer as ``<list>_by_id`` maps, built when a rule reads
    one (``state.bank_account.scheduled_transactions_by_id[id]``); iteration, ``json`` and diffs see the dump."""

    def __getitem__(self, key: Any) -> Any:
        if dict.__contains__(self, key):
            return _wrap(dict.__getitem__(self, key))
        records = self._records(key)
        if records is None:
            raise KeyError(key)
        return {r["id"]: _wrap(r) for r in records}

    def __contains__(self, key: object) -> bool:
        return dict.__contains__(self, key) or self._records(key) is not None

    def _records(self, key: object) -> list[Any] | None:
        if not isinstance(key, str) or not key.endswith("_by_id"):
            return None
        v = dict.get(self, key[: -len("_by_id")])
        if isinstance(v, list) and v and all(isinstance(i, dict) and "id" in i for i in v):
            return v
        return None


class _Records(list):
    """A list from the dump whose items are wrapped on access."""

    def __getitem__(self, i: Any) -> Any:
        return _wrap(list.__getitem__(self, i)) if isinstance(i, int) else list.__getitem__(self, i)


def _wrap(v: Any) -> Any:
    if isinstance(v, dict) and not isinstance(v, _View):
        return _View(v)
    if isinstance(v, list) and not isinstance(v, _Records):
        return _Records(v)
    return v


def view(env: Any) -> dict[str, Any]:
    """The environment as AIR sees it: ``model_dump()``, whose lists of records (dicts with an ``id``) also answer
    as ``<list>_by_id`` maps when a rule reads one. The dump is fresh on every call (no copy needed) and the maps
    cost nothing until read."""
    return _View(env.model_dump(mode="json"))


#: AgentDojo's tools whose calls change nothing in the environment (v1.2.1's source): every tool the suites'
#: manifests declare read-only but ``get_unread_emails`` (it marks the mails it returns read) and ``get_webpage`` (it
#: logs the request). A test calls each of them in every suite that has it and compares the environment's dump
#: before and after (and checks that those two do change it).
UNCHANGING_TOOLS = frozenset({
    # workspace
    "get_sent_emails", "get_received_emails", "get_draft_emails", "search_emails", "search_contacts_by_name",
    "search_contacts_by_email", "get_current_day", "search_calendar_events", "get_day_calendar_events",
    "search_files_by_filename", "get_file_by_id", "list_files", "search_files",
    # banking
    "get_iban", "get_balance", "get_most_recent_transactions", "get_scheduled_transactions", "read_file",
    "get_user_info",
    # slack
    "get_channels", "read_channel_messages", "read_inbox", "get_users_in_channel",
    # travel
    "get_user_information", "get_all_hotels_in_city", "get_hotels_prices", "get_rating_reviews_for_hotels",
    "get_hotels_address", "get_all_restaurants_in_city", "get_cuisine_type_for_restaurants",
    "get_restaurants_address", "get_rating_reviews_for_restaurants", "get_dietary_restrictions_for_all_restaurants",
    "get_contact_information_for_restaurants", "get_price_for_restaurants", "check_restaurant_opening_hours",
    "get_all_car_rental_companies_in_city", "get_car_types_available", "get_rating_reviews_for_car_rental",
    "get_car_fuel_options", "get_car_rental_address", "get_car_price_per_day", "get_flight_information",
})


class StateView:
    """:func:`view` re-dumped field by field: after a tool call only the top-level environment fields the tool can
    reach are dumped again, the others are shared with the previous view (so :func:`~icml26.air.runtime.state.diff`
    short-circuits on them by identity); after a call of one of AgentDojo's own :data:`UNCHANGING_TOOLS` nothing is.

    The fields a tool can reach are its AgentDojo dependencies (``Depends("inbox")``: the runtime hands the tool
    those fields and nothing else); a tool with a computed dependency, a tool the runtime does not know, or a view
    asked for with no call noted since the last one is dumped whole. The result equals a fresh :func:`view` as long
    as the environment changes only through the calls noted with :meth:`touched` (the adapter notes the agent's
    calls and AIR's recovery calls; a test checks the equality after every ground-truth call of every suite's user
    and injection tasks).

    With ``defer=True`` a snapshot (:meth:`deferred`, which ``DictState.snapshot`` asks for) is not dumped when taken
    but when first read, or at :meth:`before_call` of a call that can change the environment, whichever comes first:
    a call of an unchanging tool leaves the environment as the snapshot saw it, so an episode of reads dumps
    nothing it does not read (the first view of an episode is a full dump). Whoever runs the calls must then
    announce each with :meth:`before_call` (the adapter does); :meth:`touched` raises when a call that can change
    the environment ran unannounced while a snapshot waited to be built.

    Args:
        env: the AgentDojo environment (a pydantic model).
        runtime: its ``FunctionsRuntime`` (the tools' dependencies); None: every view is a full dump.
        defer: build snapshots when first read (above).

    Example:
        >>> from types import SimpleNamespace
        >>> sv = StateView(SimpleNamespace(model_dump=lambda **kw: {"a": [1]}))
        >>> sv()["a"]
        [1]
    """

    def __init__(self, env: Any, runtime: Any = None, *, defer: bool = False):
        self.env, self.defer = env, defer
        self._pending: DeferredView | None = None     # a snapshot handed out and not built yet
        self._reach: dict[str, frozenset[str] | None] = {}
        for name, fn in (getattr(runtime, "functions", None) or {}).items():
            deps = [d.env_dependency for d in fn.dependencies.values()]
            self._reach[name] = frozenset(deps) if all(isinstance(d, str) for d in deps) else None
            # AgentDojo's own function (not a user's tool of the same name) that changes nothing: reaches nothing
            if name in UNCHANGING_TOOLS and getattr(fn.run, "__module__", "").startswith("agentdojo.default_suites."):
                self._reach[name] = frozenset()
        self._last: dict[str, Any] | None = None
        self._dirty: set[str] | None = None           # fields to dump again; None: everything
        self._noted = False                            # a call was noted since the last view

    def touched(self, tool: str) -> None:
        """A call of ``tool`` has run on the environment."""
        reach = self._reach.get(tool)
        if self._pending is not None and reach != frozenset():
            self._pending = None
            raise RuntimeError(f"StateView(defer=True): {tool!r} may have changed the environment before a waiting "
                               "snapshot was built; announce every call with before_call(tool) before running it")
        self._noted = True
        if reach is None or self._dirty is None:
            self._dirty = None
        else:
            self._dirty |= reach

    def before_call(self, tool: str) -> None:
        """A call of ``tool`` is about to run: a waiting snapshot is built now unless the tool changes nothing."""
        if self._pending is not None and self._reach.get(tool) != frozenset():
            self._pending.value()

    def deferred(self) -> Any:
        """A snapshot of the environment now: with ``defer``, a :class:`~icml26.air.runtime.state.DeferredView` (one per
        state: the same object until it is built); otherwise the view itself."""
        if not self.defer:
            return self()
        if self._pending is None:
            self._pending = DeferredView(self._build_pending)
        return self._pending

    def _build_pending(self) -> dict[str, Any]:
        self._pending = None
        return self._build()

    def __call__(self) -> dict[str, Any]:
        if self._pending is not None:                  # the waiting snapshot is the view now: built once
            return self._pending.value()
        return self._build()

    def _build(self) -> dict[str, Any]:
        dirty, last = self._dirty, self._last
        if last is None or dirty is None or not self._noted:
            dump = self.env.model_dump(mode="json")   # the first view, or any doubt
        else:                                         # the fields no noted call can reach are the earlier objects
            dump = dict(last)
            if dirty:
                dump.update(self.env.model_dump(mode="json", include=dirty))
        self._last, self._dirty, self._noted = dump, set(), False
        return _View(dump)


def _content(text: str) -> list[Any]:
    return [text_content_block_from_string(text)]



class AIRToolsExecutor(BasePipelineElement):
    """AgentDojo's tool executor with AIR around every call (see the module docstring).

    Attributes:
        calls: ``(function, args as JSON, executed, incidents so far)`` per tool call.
        episode_open: whether an episode this executor began is not finished yet.
    """

    name = "air-tools-executor"

    def __init__(self, responder: IncidentResponder | None, confirm: Any = None):
        self.responder = responder
        #: ``confirm(call, env) -> bool``: the user asked when AIR's decision is ``ask_user`` (True: the call runs);
        #: None: nobody to ask, so the call is withheld (fail closed)
        self.confirm = confirm
        self._env_id: int | None = None
        self._view: StateView | None = None
        self.episode_open = False
        self.calls: list[tuple[str, str, bool, int]] = []  # (function, args, executed, incidents so far)

    def finish(self) -> list[Any]:
        """End the open episode (end-of-episode rules, eradication) once; its incidents ([] when none is open).
        The next tool calls begin a new episode, even on the same environment object."""
        if not self.episode_open or self.responder is None:
            return []
        self.episode_open, self._env_id = False, None
        return self.responder.finish()

    def query(self, query: str, runtime: Any, env: Any = None, messages: Sequence[Any] = (),
              extra_args: dict | None = None) -> tuple[str, Any, Any, Sequence[Any], dict]:
        extra_args = {} if extra_args is None else extra_args
        if not messages or messages[-1]["role"] != "assistant" or not messages[-1]["tool_calls"]:
            return query, runtime, env, messages, extra_args
        air = self.responder
        if air is not None and self._env_id != id(env):
            self.finish()                      # a new task run: the previous run's episode ends (once)
            self._env_id = id(env)
            # view() builds a new dict (no deep copy); the environment changes only through the tool calls AIR
            # sees (the agent's and AIR's recovery calls), so one dump per call serves every hook (copy-on-write)
            # and only the fields the call can reach are dumped again (StateView)
            state = self._view = StateView(env, runtime, defer=True)
            air.state = DictState(state, cache=True)

            def execute(call: ToolCall) -> Any:
                state.before_call(call.name)
                result, error = runtime.run_function(env, call.name, dict(call.args))
                state.touched(call.name)
                if error:
                    raise RuntimeError(error)
                return result

            air.begin(query, executor=execute)
            self.episode_open = True
        out = []
        for tc in messages[-1]["tool_calls"]:
            call = ToolCall(tc.function, dict(tc.args))
            if air is not None:
                d = air.before_step()
                if d.kind != "stop":
                    d = air.before_action(call)
                if d.kind == "stop":
                    raise AbortAgentError(f"[AIR] {d.message}", [*messages, *out], env)
                if d.kind == "ask_user" and self.confirm is not None and self.confirm(call, env):
                    d = replace(d, kind="allow")           # the user confirmed: the call runs
                if d.kind in ("block", "ask_user"):
                    self.calls.append((tc.function, _key(tc.args), False, len(air.incidents)))
                    out.append(ChatToolResultMessage(role="tool", content=_content(f"[AIR] {d.message}"),
                                                     tool_call_id=tc.id, tool_call=tc, error=d.message))
                    continue
            self.calls.append((tc.function, _key(tc.args), True, len(air.incidents) if air is not None else 0))
            if air is not None and self._view is not None:
                self._view.before_call(tc.function)
            result, error = runtime.run_function(env, tc.function, tc.args)
            text = tool_result_to_str(result) if error is None else f"error: {error}"
            if air is not None:
                if self._view is not None:
                    self._view.touched(tc.function)
                d = air.after_action(call, text)
                if d.kind == "stop":
                    raise AbortAgentError(f"[AIR] {d.message}", [*messages, *out], env)
                if d.kind == "block":
                    text, error = f"[AIR] {d.message}", d.message
            out.append(ChatToolResultMessage(role="tool", content=_content(text), tool_call_id=tc.id, tool_call=tc,
                                             error=error))
        return query, runtime, env, [*messages, *out], extra_args


class AIRToolsExecutionLoop(ToolsExecutionLoop):
    """AgentDojo's ``ToolsExecutionLoop`` that finishes the episode of each :class:`AIRToolsExecutor` among its
    ``elements`` when the loop ends, normally or by an abort (AIR's stop included): the end of a task run."""

    def query(self, query: str, runtime: Any, env: Any = None, messages: Sequence[Any] = (),
              extra_args: dict | None = None) -> tuple[str, Any, Any, Sequence[Any], dict]:
        try:
            return super().query(query, runtime, EmptyEnv() if env is None else env, messages,
                                 {} if extra_args is None else extra_args)
        finally:
            for element in self.elements:
                if isinstance(element, AIRToolsExecutor):
                    element.finish()


def _key(args: Any) -> str:
    import json

    return json.dumps(dict(args), sort_keys=True, default=str)


class _FastYaml:
    """``yaml`` for AgentDojo's task suite with ``safe_load`` through libyaml's C loader when available (the
    environment is re-parsed for every run; the pure-Python parser dominated the evaluation's time)."""

    def __init__(self, yaml: Any):
        self._yaml = yaml

    def __getattr__(self, name: str) -> Any:
        return getattr(self._yaml, name)

    def safe_load(self, stream: Any) -> Any:
        loader = getattr(self._yaml, "CSafeLoader", self._yaml.SafeLoader)
        return self._yaml.load(stream, Loader=loader)


def _fast_yaml() -> None:
    from agentdojo.task_suite import task_suite

    if not isinstance(task_suite.yaml, _FastYaml):
        task_suite.yaml = _FastYaml(task_suite.yaml)
