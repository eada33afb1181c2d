"""AIR's policy layer, tool manifests: what each tool does (effect classes), whom it reaches, what it touches and
how to undo it.

Generic AIR rules (``rules/generic.air``) are written once over these declarations instead of per tool or per
attack. A :class:`ToolSpec` declares

- ``effects``: effect classes from :data:`EFFECTS` (``reads_untrusted``: returns content others wrote;
  ``sends_out``: data or a request leaves the user's account; ``persists``: creates or changes a stored record;
  ``destroys``: deletes or cancels; ``changes_permissions``: grants access or changes credentials;
  ``moves_money``; ``irreversible``: no inverse operation exists);
- ``targets``: the argument names naming an outside party or resource the call reaches (recipients, accounts,
  URLs, invitees); ``content``: the arguments whose values leave with the call;
- ``resources``: the state paths the tool writes (dotted; what a recovery must restore);
- ``args``: the tool's parameter names, all of them (None: not declared); with them a rule's ``call.args.X``
  that no tool its trigger matches takes is refused when the rules are loaded (``parse(..., manifest=m)``,
  ``lint(..., manifest=m)``, ``icml26 air check --manifest``);
- ``inverse``: the inverse operation, an :class:`Inverse` whose arguments are bound from the call and the state
  (``arg:NAME``; ``args:NAME``: as a one-item list; ``lit:JSON``; ``pre:PATH`` with ``{NAME}`` filled from the call and ``[field={NAME}]`` selecting a record of a
  list; ``created:PATH``: the key of the record that appeared under ``PATH`` in the state diff; ``*`` stands for
  every other argument the call set). The set of inverses is the allowlist recovery must stay inside.

A :class:`Manifest` also names the tools there are (a trigger or recovery tool it lacks is refused at load time) and
may declare ``state``, the top-level keys of the state view (``state.X`` outside them is refused).

At runtime the responder binds ``call.effects``, ``call.targets`` (normalised, lists flattened) and
``call.content`` from the manifest, and ``ctx.known_parties`` from the ``known`` state paths (the user's
contacts, existing counterparties, workspace members): parties the user already deals with.

Example:
    >>> m = Manifest({"send": ToolSpec({"sends_out", "irreversible"}, targets=("to",), content=("body",)),
    ...               "share": ToolSpec({"changes_permissions"}, targets=("email",),
    ...                                 inverse=Inverse("unshare", {"email": "arg:email"}))})
    >>> m.call_fields("send", {"to": ["Eve@Evil.io "], "body": "hi"})["targets"]
    ['eve@evil.io']
    >>> sorted(m.recovery_tools())
    ['unshare']
    >>> m.inverse_call("share", {"email": "e@x.io"}, {}, {}).args
    {'email': 'e@x.io'}
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ..core.entities import entities
from ..core.records import ToolCall
from ..core.text import normalize

EFFECTS = (
    "reads",
    "reads_untrusted",
    "sends_out",
    "persists",
    "destroys",
    "changes_permissions",
    "moves_money",
    "irreversible",
)
# the words with which a user asks for an effect class (generic, per class: never per tool or per attack)
EFFECT_INTENT = {
    "destroys": r"delete|remove|cancel|clear|erase|trash|clean|unsubscribe|kick",
    "changes_permissions": r"password|invite|share|grant|access|permission|add\b.{0,40}\b(to|in)\b|join|member",
    "moves_money": r"pay|send|transfer|refund|money|rent|bill|subscription|payment|book|reserv|schedul|transaction",
    "persists": r"create|add|schedule|book|reserv|save|write|append|update|change|set\b|put|make|organi[sz]e|plan"
    r"|invite|calendar|event|file|rename|move|reschedul|remind|note|list",
    "sends_out": r"send|email|e-mail|mail\b|message|share|post|invite|forward|reply|tell|notify|contact|dm\b"
    r"|publish|visit|website|summar",
}


@dataclass(frozen=True)
class Inverse:
    """A tool's inverse operation: ``tool`` called with ``args`` (name -> binding, see the module docstring)."""

    tool: str
    args: Mapping[str, str] = field(default_factory=dict)


#: the effect classes that change something outside the agent: a tool of one of them with no declared inverse is
#: ``irreversible`` (data sent out cannot be called back, like money paid or a file deleted)
STATE_CHANGING = frozenset({"persists", "destroys", "changes_permissions", "moves_money", "sends_out"})


@dataclass(frozen=True)
class ToolSpec:
    """What one tool does (see the module docstring)."""

    effects: frozenset[str] | set[str] | Sequence[str]
    targets: tuple[str, ...] = ()
    content: tuple[str, ...] = ()
    resources: tuple[str, ...] = ()
    inverse: Inverse | None = None
    args: tuple[str, ...] | None = None
    classify: Callable[[Mapping[str, Any]], tuple[Iterable[str], Iterable[str]]] | None = None
    """per call: ``args -> (effect classes, targets)`` replacing ``effects``/``targets`` for that call (a shell's
    ``run`` whose command decides what it does, ``policy.prevention.shell_effects``); None: the declared ones"""

    def __post_init__(self) -> None:
        if self.args is not None:
            if isinstance(self.args, str) or not all(isinstance(a, str) for a in self.args):
                raise TypeError(f"args must be a sequence of parameter names, got {self.args!r}")
            object.__setattr__(self, "args", tuple(self.args))
            undeclared = sorted((set(self.targets) | set(self.content)) - set(self.args))
            if undeclared:
                raise ValueError(f"targets/content name argument(s) {undeclared} not among args {list(self.args)}")
        object.__setattr__(self, "effects", self._checked(self.effects, "effects"))

    def call_effects(self, args: Mapping[str, Any]) -> tuple[frozenset[str], list[Any]]:
        """The effect classes and raw target values of one call: ``classify(args)`` when declared (with
        ``irreversible`` added as for the declared effects), otherwise the declared ``effects`` and the values
        of the ``targets`` arguments."""
        if self.classify is None:
            return frozenset(self.effects), [v for a in self.targets for v in _flat(args.get(a))]
        eff, targets = self.classify(args)
        return self._checked(eff, "classify's effects"), list(targets)

    def _checked(self, effects: Iterable[str], what: str) -> frozenset[str]:
        """``effects`` as a frozenset of known classes, with ``irreversible`` added when one changes something
        (:data:`STATE_CHANGING`) and the tool declares no inverse."""
        eff = frozenset(effects)
        bad = sorted(eff - set(EFFECTS))
        if bad:
            raise ValueError(f"{what}: unknown effect class(es) {bad} (known: {', '.join(EFFECTS)})")
        if self.inverse is None and eff & STATE_CHANGING:
            eff |= {"irreversible"}  # no inverse: cannot be undone (data that left cannot be called back)
        return eff


class Manifest:
    """Tool name -> :class:`ToolSpec`, plus ``known`` state paths whose values are parties the user deals with.

    Args:
        tools: the declarations: every tool the agent has.
        known: dotted state paths (``[*]`` walks every item of a list or mapping; ``.field`` then reads a field)
            whose string values form ``ctx.known_parties``.
        state: the top-level keys of the state view the rules read as ``state`` (and ``snap.pre_step``); None:
            not declared (no state path is refused).
        allow: a deployment allowlist (domains, accounts; ``policy.prevention.load_allowlist``), known parties
            whatever the state holds.
    """

    def __init__(self, tools: Mapping[str, ToolSpec], known: Sequence[str] = (),
                 state: Sequence[str] | None = None, allow: Sequence[str] = ()):
        if isinstance(allow, str) or not all(isinstance(a, str) for a in allow):
            raise TypeError(f"allow must be a sequence of domains or accounts, got {allow!r}")
        self.allow = tuple(normalize(a) for a in allow)
        for name, spec in tools.items():
            if not isinstance(spec, ToolSpec):
                raise TypeError(f"tools[{name!r}] must be a ToolSpec, got {type(spec).__name__}")
        if isinstance(state, str) or (state is not None and not all(isinstance(k, str) for k in state)):
            raise TypeError(f"state must be a sequence of key names, got {state!r}")
        self.tools, self.known = dict(tools), tuple(known)
        self.state = tuple(state) if state is not None else None
        if self.state is not None:
            for name, spec in self.tools.items():
                for r in spec.resources:
                    if _root(r) not in self.state:
                        raise ValueError(f"tools[{name!r}] writes resource {r!r}, whose root {_root(r)!r} is not a "
                                         f"state key ({', '.join(self.state)}): its undo could never be verified")

    def __contains__(self, tool: object) -> bool:
        return tool in self.tools

    def spec(self, tool: str) -> ToolSpec | None:
        return self.tools.get(tool)

    def effects(self, tool: str) -> frozenset[str]:
        spec = self.tools.get(tool)
        return frozenset(spec.effects) if spec is not None else frozenset()

    def recovery_tools(self) -> frozenset[str]:
        """The declared inverse operations: the only tools recovery may call."""
        return frozenset(s.inverse.tool for s in self.tools.values() if s.inverse is not None)

    def read_only(self, tool: str) -> bool:
        """Whether a tool only reads (its calls cannot change the state)."""
        eff = self.effects(tool)
        return bool(eff) and eff <= {"reads", "reads_untrusted"}

    def call_fields(self, tool: str, args: Mapping[str, Any]) -> dict[str, list[Any]]:
        """``effects``, ``targets``, ``content`` and ``content_entities`` (:func:`entities` of the content) of one
        call (targets normalised, lists flattened)."""
        spec = self.tools.get(tool)
        if spec is None:
            return {"effects": [], "targets": [], "content": [], "content_entities": []}
        effects, raw = spec.call_effects(args)
        targets = [normalize(v) for v in raw if isinstance(v, str) and v.strip()]
        content = [v for a in spec.content for v in _flat(args.get(a)) if v is not None]
        return {
            "effects": sorted(effects),
            "targets": targets,
            "content": content,
            "content_entities": sorted(entities(content)),
        }

    def known_parties(self, state: Any) -> list[str]:
        """The normalised string values under the ``known`` state paths, and the ``allow`` list."""
        out: set[str] = set(self.allow)
        for path in self.known:
            for v in _walk_path(state, path.split(".")):
                out.update(normalize(s) for s in _flat(v) if isinstance(s, str))
        return sorted(out)

    def inverse_call(self, tool: str, args: Mapping[str, Any], pre: Any, post: Any) -> Any:
        """The :class:`~icml26.air.core.records.ToolCall` that undoes ``tool(**args)`` (None: no inverse, or a
        binding that cannot be resolved)."""
        spec = self.tools.get(tool)
        if spec is None or spec.inverse is None:
            return None
        out: dict[str, Any] = {}
        for name, how in spec.inverse.args.items():
            names = [a for a in args if a not in spec.inverse.args] if name == "*" else [name]
            for n in names:
                v = _bind(how.replace("{*}", n), args, pre, post)
                if v is _NONE:
                    return None
                out[n] = v
        return ToolCall(spec.inverse.tool, out, origin="air")

    def restored(self, tool: str, args: Mapping[str, Any], pre: Any, now: Any) -> bool:
        """Whether the resources ``tool`` writes are as they were before the call (undo verified on the state).

        A record absent before and after counts as restored (a created record removed again), but a resource
        whose root key is in neither state verifies nothing and returns False; lists compare as multisets (an
        undo may put a record back at another position)."""
        spec = self.tools.get(tool)
        if spec is None or not spec.resources:
            return False
        for r in spec.resources:
            if not any(isinstance(s, Mapping) and _root(r) in s for s in (pre, now)):
                return False
            if _canon(_live(_get(pre, r, args))) != _canon(_live(_get(now, r, args))):
                return False
        return True


class _None:
    pass


_NONE = _None()
_SELECT = re.compile(r"^(\w+)\[(\w+)=\{(\w+)\}\]$")


def _live(v: Any) -> Any:
    """A mapping of records without those marked canceled (a canceled record counts as undone)."""
    if isinstance(v, Mapping):
        return {k: r for k, r in v.items() if not (isinstance(r, Mapping) and r.get("status") == "canceled")}
    return v


def _root(path: str) -> str:
    """The top-level state key of a resource path (``inbox``, ``calendar`` of ``calendar.events[id={x}]``)."""
    head = path.split(".", 1)[0]
    m = _SELECT.match(head)
    return m.group(1) if m else head


def _canon(v: Any) -> Any:
    """Lists as multisets (sorted by their JSON text), recursively; everything else as is."""
    if isinstance(v, Mapping):
        return {k: _canon(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return sorted((_canon(x) for x in v), key=lambda x: json.dumps(x, sort_keys=True, default=str))
    return v


def _flat(v: Any) -> list[Any]:
    if isinstance(v, list | tuple | set):
        return [x for i in v for x in _flat(i)]
    return [] if v is None else [v]


def _walk_path(v: Any, parts: Sequence[str]) -> Iterable[Any]:
    if not parts:
        yield v
        return
    head, rest = parts[0], parts[1:]
    if head == "[*]":
        items = v.values() if isinstance(v, Mapping) else v if isinstance(v, list | tuple) else []
        for i in items:
            yield from _walk_path(i, rest)
    elif isinstance(v, Mapping) and head in v:
        yield from _walk_path(v[head], rest)


def _get(state: Any, path: str, args: Mapping[str, Any]) -> Any:
    """``a.{arg}.b`` or ``a.list[field={arg}].b`` in ``state`` (``_NONE`` when absent)."""
    v = state
    for part in path.split("."):
        m = _SELECT.match(part)
        if m:
            key, fld, arg = m.groups()
            seq = v.get(key) if isinstance(v, Mapping) else None
            target = args.get(arg)
            found = [i for i in (seq or []) if isinstance(i, Mapping) and str(i.get(fld)) == str(target)]
            if not found:
                return _NONE
            v = found[0]
            continue
        if part.startswith("{") and part.endswith("}"):
            part = str(args.get(part[1:-1]))
        if not isinstance(v, Mapping) or part not in v:
            return _NONE
        v = v[part]
    return v


def _bind(how: str, args: Mapping[str, Any], pre: Any, post: Any) -> Any:
    kind, _, rest = how.partition(":")
    if kind == "arg":
        return args[rest] if rest in args else _NONE
    if kind == "args":  # the argument as a one-item list
        return [args[rest]] if rest in args else _NONE
    if kind == "lit":
        return json.loads(rest)
    if kind == "pre":
        return _get(pre, rest, args)
    if kind == "created":
        before, after = _get(pre, rest, args), _get(post, rest, args)
        if not isinstance(after, Mapping):
            return _NONE
        new = [k for k in after if not isinstance(before, Mapping) or k not in before]
        return new[0] if len(new) == 1 else _NONE
    raise ValueError(f"unknown binding {how!r} (arg:, args:, lit:, pre:, created:)")


def _t(
    effects: str, targets: str = "", content: str = "", resources: str = "", inverse: Inverse | None = None
) -> ToolSpec:
    return ToolSpec(
        frozenset(effects.split()),
        tuple(targets.split()),
        tuple(content.split()),
        tuple(resources.split()),
        inverse,
    )


def _declare(m: Manifest, args: Mapping[str, str], state: Sequence[str] | None = None) -> Manifest:
    """``m`` with every tool's parameter names (``args``: tool -> names, space-separated) and the state's keys."""
    if set(args) != set(m.tools):
        raise ValueError(f"args declared for {sorted(set(args) ^ set(m.tools))}: not the manifest's tools")
    return Manifest({n: replace(s, args=tuple(args[n].split())) for n, s in m.tools.items()}, m.known, state)


_READ_U = _t("reads_untrusted")
_READ = _t("reads")
#: the calendar tools workspace and travel share (one AgentDojo calendar component)
_CALENDAR_WRITES = {
    "create_calendar_event": _t(
        "persists sends_out",
        "participants",
        "title description",
        "calendar.events",
        Inverse("cancel_calendar_event", {"event_id": "created:calendar.events"}),
    ),
    "cancel_calendar_event": _t("destroys sends_out", "", "", "calendar.events"),
}

# --------------------------------------------------------------------------- AgentDojo v1.2.1, four suites
AGENTDOJO: dict[str, Manifest] = {
    "banking": Manifest(
        {
            "get_iban": _READ,
            "get_balance": _READ,
            "get_user_info": _READ,
            "get_most_recent_transactions": _READ_U,
            "get_scheduled_transactions": _READ_U,
            "read_file": _READ_U,
            "send_money": _t("moves_money sends_out", "recipient", "subject", "bank_account.transactions"),
            "schedule_transaction": _t(
                "moves_money persists", "recipient", "subject", "bank_account.scheduled_transactions"
            ),
            "update_scheduled_transaction": _t(
                "moves_money persists",
                "recipient",
                "subject",
                "bank_account.scheduled_transactions",
                Inverse(
                    "update_scheduled_transaction",
                    {"id": "arg:id", "*": "pre:bank_account.scheduled_transactions[id={id}].{*}"},
                ),
            ),
            "update_password": _t(
                "changes_permissions",
                "",
                "",
                "user_account.password",
                Inverse("update_password", {"password": "pre:user_account.password"}),
            ),
            "update_user_info": _t(
                "persists", "", "", "user_account", Inverse("update_user_info", {"*": "pre:user_account.{*}"})
            ),
        },
        known=(
            "bank_account.transactions.[*].recipient",
            "bank_account.transactions.[*].sender",
            "bank_account.scheduled_transactions.[*].recipient",
            "bank_account.iban",
        ),
    ),
    "slack": Manifest(
        {
            "get_channels": _READ,
            "get_users_in_channel": _READ,
            "read_channel_messages": _READ_U,
            "read_inbox": _READ_U,
            "get_webpage": _READ_U,
            "add_user_to_channel": _t("changes_permissions", "user channel", "", "slack.user_channels"),
            "send_direct_message": _t("sends_out irreversible", "recipient", "body"),
            "send_channel_message": _t("sends_out irreversible", "channel", "body"),
            "invite_user_to_slack": _t(
                "changes_permissions",
                "user user_email",
                "",
                "slack.users",
                Inverse("remove_user_from_slack", {"user": "arg:user"}),
            ),
            "remove_user_from_slack": _t("destroys changes_permissions", "user", "", "slack.users"),
            "post_webpage": _t("sends_out irreversible", "url", "content"),
        },
        known=("slack.users", "slack.channels"),
    ),
    "workspace": Manifest(
        {
            **{
                t: _READ_U
                for t in (
                    "get_unread_emails",
                    "get_sent_emails",
                    "get_received_emails",
                    "get_draft_emails",
                    "search_emails",
                    "search_calendar_events",
                    "get_day_calendar_events",
                    "search_files_by_filename",
                    "get_file_by_id",
                    "list_files",
                    "search_files",
                )
            },
            **{t: _READ for t in ("search_contacts_by_name", "search_contacts_by_email", "get_current_day")},
            "send_email": _t("sends_out irreversible", "recipients cc bcc", "subject body attachments"),
            "delete_email": _t("destroys", "", "", "inbox.emails"),
            **_CALENDAR_WRITES,
            "reschedule_calendar_event": _t(
                "persists sends_out",
                "",
                "",
                "calendar.events.{event_id}",
                Inverse(
                    "reschedule_calendar_event",
                    {
                        "event_id": "arg:event_id",
                        "new_start_time": "pre:calendar.events.{event_id}.start_time",
                        "new_end_time": "pre:calendar.events.{event_id}.end_time",
                    },
                ),
            ),
            "add_calendar_event_participants": _t(
                "changes_permissions sends_out", "participants", "", "calendar.events.{event_id}"
            ),
            "append_to_file": _t("persists", "", "", "cloud_drive.files.{file_id}"),
            "create_file": _t(
                "persists",
                "",
                "",
                "cloud_drive.files",
                Inverse("delete_file", {"file_id": "created:cloud_drive.files"}),
            ),
            "delete_file": _t("destroys", "", "", "cloud_drive.files"),
            "share_file": _t("changes_permissions sends_out", "email", "", "cloud_drive.files.{file_id}"),
        },
        known=("inbox.contact_list.[*].email", "inbox.account_email"),
    ),
    "travel": Manifest(
        {
            **{
                t: _READ_U
                for t in (
                    "get_all_hotels_in_city",
                    "get_hotels_prices",
                    "get_rating_reviews_for_hotels",
                    "get_hotels_address",
                    "get_all_restaurants_in_city",
                    "get_cuisine_type_for_restaurants",
                    "get_restaurants_address",
                    "get_rating_reviews_for_restaurants",
                    "get_dietary_restrictions_for_all_restaurants",
                    "get_contact_information_for_restaurants",
                    "get_price_for_restaurants",
                    "check_restaurant_opening_hours",
                    "get_all_car_rental_companies_in_city",
                    "get_car_types_available",
                    "get_rating_reviews_for_car_rental",
                    "get_car_fuel_options",
                    "get_car_rental_address",
                    "get_car_price_per_day",
                    "search_calendar_events",
                    "get_day_calendar_events",
                    "get_flight_information",
                )
            },
            "get_user_information": _READ,
            **_CALENDAR_WRITES,
            "reserve_hotel": _t("persists moves_money", "hotel", "", "reservation"),
            "reserve_car_rental": _t("persists moves_money", "company", "", "reservation"),
            "reserve_restaurant": _t("persists moves_money", "restaurant", "", "reservation"),
            "send_email": _t("sends_out irreversible", "recipients cc bcc", "subject body attachments"),
        },
        known=("user.email", "inbox.contact_list.[*].email", "inbox.account_email"),
    ),
}
#: every AgentDojo v1.2.1 tool's parameters (a test checks them against AgentDojo's own signatures); the state view
#: (``integrations.agentdojo.StateView``) is not declared here
_AGENTDOJO_ARGS: dict[str, dict[str, str]] = {
    "banking": {
        "get_iban": "",
        "send_money": "recipient amount subject date",
        "schedule_transaction": "recipient amount subject date recurring",
        "update_scheduled_transaction": "id recipient amount subject date recurring",
        "get_balance": "",
        "get_most_recent_transactions": "n",
        "get_scheduled_transactions": "",
        "read_file": "file_path",
        "get_user_info": "",
        "update_password": "password",
        "update_user_info": "first_name last_name street city",
    },
    "slack": {
        "get_channels": "",
        "add_user_to_channel": "user channel",
        "read_channel_messages": "channel",
        "read_inbox": "user",
        "send_direct_message": "recipient body",
        "send_channel_message": "channel body",
        "get_users_in_channel": "channel",
        "invite_user_to_slack": "user user_email",
        "remove_user_from_slack": "user",
        "get_webpage": "url",
        "post_webpage": "url content",
    },
    "workspace": {
        "send_email": "recipients subject body attachments cc bcc",
        "delete_email": "email_id",
        "get_unread_emails": "",
        "get_sent_emails": "",
        "get_received_emails": "",
        "get_draft_emails": "",
        "search_emails": "query sender",
        "search_contacts_by_name": "query",
        "search_contacts_by_email": "query",
        "get_current_day": "",
        "search_calendar_events": "query date",
        "get_day_calendar_events": "day",
        "create_calendar_event": "title start_time end_time description participants location",
        "cancel_calendar_event": "event_id",
        "reschedule_calendar_event": "event_id new_start_time new_end_time",
        "add_calendar_event_participants": "event_id participants",
        "append_to_file": "file_id content",
        "search_files_by_filename": "filename",
        "create_file": "filename content",
        "delete_file": "file_id",
        "get_file_by_id": "file_id",
        "list_files": "",
        "share_file": "file_id email permission",
        "search_files": "query",
    },
    "travel": {
        "get_user_information": "",
        "get_all_hotels_in_city": "city",
        "get_hotels_prices": "hotel_names",
        "get_rating_reviews_for_hotels": "hotel_names",
        "get_hotels_address": "hotel_name",
        "get_all_restaurants_in_city": "city",
        "get_cuisine_type_for_restaurants": "restaurant_names",
        "get_restaurants_address": "restaurant_names",
        "get_rating_reviews_for_restaurants": "restaurant_names",
        "get_dietary_restrictions_for_all_restaurants": "restaurant_names",
        "get_contact_information_for_restaurants": "restaurant_names",
        "get_price_for_restaurants": "restaurant_names",
        "check_restaurant_opening_hours": "restaurant_names",
        "get_all_car_rental_companies_in_city": "city",
        "get_car_types_available": "company_name",
        "get_rating_reviews_for_car_rental": "company_name",
        "get_car_fuel_options": "company_name",
        "get_car_rental_address": "company_name",
        "get_car_price_per_day": "company_name",
        "create_calendar_event": "title start_time end_time description participants location",
        "search_calendar_events": "query date",
        "get_day_calendar_events": "day",
        "cancel_calendar_event": "event_id",
        "reserve_hotel": "hotel start_day end_day",
        "reserve_car_rental": "company start_time end_time",
        "reserve_restaurant": "restaurant start_time",
        "get_flight_information": "departure_city arrival_city",
        "send_email": "recipients subject body attachments cc bcc",
    },
}
AGENTDOJO = {suite: _declare(m, _AGENTDOJO_ARGS[suite]) for suite, m in AGENTDOJO.items()}

# --------------------------------------------------------------------------- the embedded environments
EMBEDDED: dict[str, Manifest] = {
    "shell": Manifest(
        {
            "shell.run": _t("reads_untrusted persists destroys sends_out", "command", "command", "files"),
            "trash.restore": _t("persists"),
            "fs.chmod": _t("changes_permissions", "", "", "files"),
            "fs.remove": _t("destroys", "", "", "files"),
            "fs.remove_line": _t("persists", "", "", "files"),
            "cron.remove": _t("destroys", "", "", "cron"),
            "service.start": _t("persists", "", "", "services"),
        }
    ),
    "email": Manifest(
        {
            "email.list": _READ_U,
            "email.read": _READ_U,
            "web.get": _READ_U,
            "email.send": _t("sends_out irreversible", "to", "subject body"),
            "email.delete": _t("destroys", "", "", "inbox", Inverse("email.restore", {"ids": "args:id"})),
            "email.restore": _t("persists"),
            "email.add_forwarding": _t(
                "sends_out changes_permissions",
                "email",
                "",
                "forwarding",
                Inverse("email.remove_forwarding", {"email": "arg:email"}),
            ),
            "email.remove_forwarding": _t("changes_permissions"),
            "drive.share_file": _t(
                "changes_permissions sends_out",
                "email",
                "",
                "drive",
                Inverse("drive.unshare", {"file_id": "arg:file_id", "email": "arg:email"}),
            ),
            "drive.unshare": _t("changes_permissions"),
            "drive.set_public": _t(
                "changes_permissions sends_out",
                "",
                "",
                "drive",
                Inverse("drive.set_public", {"file_id": "arg:file_id", "public": "lit:false"}),
            ),
            "calendar.add_attendee": _t(
                "changes_permissions sends_out",
                "email",
                "",
                "calendar",
                Inverse("calendar.remove_attendee", {"event_id": "arg:event_id", "email": "arg:email"}),
            ),
            "calendar.remove_attendee": _t("changes_permissions"),
            "contacts.update": _t("persists", "email", "", "contacts"),
            "account.change_password": _t("changes_permissions", "", "", "password"),
        },
        known=("contacts.[*]",),
    ),
    "household": Manifest(
        {
            "robot.look": _READ,
            "robot.turn_on": _t(
                "persists", "", "", "objects", Inverse("robot.turn_off", {"object": "arg:object"})
            ),
            "robot.turn_off": _t("persists"),
            "robot.put": _t("persists"),
            "robot.pick": _t("persists"),
            "robot.open": _t("persists", "", "", "objects", Inverse("robot.close", {"object": "arg:object"})),
            "robot.close": _t("persists"),
            "robot.pour": _t("persists destroys"),
            "robot.light": _t(
                "persists", "", "", "objects", Inverse("robot.extinguish", {"object": "arg:object"})
            ),
            "robot.extinguish": _t("persists"),
            "robot.throw": _t("destroys"),
        }
    ),
}

#: every embedded tool's parameters and the top-level keys of each environment's state view (``Env.view()``; a test
#: checks both against ``worlds.embedded``)
_EMBEDDED_ARGS: dict[str, dict[str, str]] = {
    "shell": {
        "cron.remove": "line",
        "fs.chmod": "path mode",
        "fs.remove": "path",
        "fs.remove_line": "path line",
        "service.start": "name",
        "shell.run": "command",
        "trash.restore": "paths",
    },
    "email": {
        "account.change_password": "new",
        "calendar.add_attendee": "event_id email",
        "calendar.remove_attendee": "event_id email",
        "contacts.update": "name email",
        "drive.set_public": "file_id public",
        "drive.share_file": "file_id email",
        "drive.unshare": "file_id email",
        "email.add_forwarding": "email",
        "email.delete": "id",
        "email.list": "",
        "email.read": "id",
        "email.remove_forwarding": "email",
        "email.restore": "ids",
        "email.send": "to subject body",
        "web.get": "url",
    },
    "household": {
        "robot.close": "object",
        "robot.extinguish": "object",
        "robot.light": "object",
        "robot.look": "object",
        "robot.open": "object",
        "robot.pick": "object",
        "robot.pour": "object target",
        "robot.put": "object receptacle",
        "robot.throw": "object",
        "robot.turn_off": "object",
        "robot.turn_on": "object",
    },
}
_EMBEDDED_STATE = {
    "shell": "files trash deleted cron net services",
    "email": "inbox sent trash drive forwarding calendar contacts password web",
    "household": "objects open_appliances running_water heat_on_empty",
}
EMBEDDED = {t: _declare(m, _EMBEDDED_ARGS[t], _EMBEDDED_STATE[t].split()) for t, m in EMBEDDED.items()}


def agentdojo_manifest(suite: str) -> Manifest:
    """The manifest of one AgentDojo v1.2.1 suite (banking, slack, workspace, travel)."""
    if suite not in AGENTDOJO:
        raise ValueError(f"suite must be one of {sorted(AGENTDOJO)}, got {suite!r}")
    return AGENTDOJO[suite]



__all__ = [
    "AGENTDOJO",
    "EFFECTS",
    "EFFECT_INTENT",
    "EMBEDDED",
    "Inverse",
    "Manifest",
    "ToolSpec",
    "agentdojo_manifest",
]
