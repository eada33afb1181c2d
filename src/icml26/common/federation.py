"""The federation harness shared by the federated papers (fedit, xfedalign, fedtreelora).

A federated method is written once, framework-free, as a ``FederatedAlgorithm``: the server configures a
message for every client, each client answers from its local data (and its private state, kept across
rounds), the server aggregates the answers; repeat for ``rounds`` rounds. Messages and answers are
``Payload``s: flat dicts of NumPy arrays and scalars (int, float, str, bool) — what Flower's records carry.

Two ways to run the same algorithm:

- ``run_in_process``: clients in a fixed order in this process; fast and deterministic (quick/full modes, CI).
  With ``transcript=True`` it also returns what every client sent (the "only aggregates leave a client" check).
- On Flower, as users deploy it: ``flower_server_app`` and ``flower_client_app`` build a ``ServerApp`` (``@main``
  over ``grid.send_and_receive``) and a ``ClientApp`` (``@query`` / ``@train``) from the algorithm; a paper puts
  them in a module and a Flower App project (a ``pyproject.toml`` naming them) beside it, and runs it with
  ``flwr run``. Clients only see their own data (``load_data(partition_id, node_config, run_config)``) and keep
  their state in ``context.state``; the server only sees what clients answer. ``LocalFederation`` starts a
  SuperLink (simulation engine, or deployment engine with one SuperNode subprocess per client) on loopback
  ports, submits the app with ``flwr run`` and reads back the result and the ``Transcript``. No deprecated
  Flower call (``run_simulation``, ``start_simulation``) is used.
- A paper's Flower App (fedit, fedtreelora, xfedalign) is built from the same pieces: ``flower_server_app`` /
  ``flower_client_app`` (each bound with a plain ``server_app = ...`` / ``client_app = ...``: ``flwr run`` checks
  the names of ``[tool.flwr.app.components]`` in the module's source, and a tuple assignment fails that check),
  ``client_data_path`` / ``demo_clients`` (where a client finds its data: ``data-path``, ``data-dir`` or the
  ``"demo"``), ``write_clients`` and ``run_flower_app`` (its data written one file per client, the app run on a
  ``LocalFederation``, simulation or deployment engine).

**Failure policy** (``FailurePolicy``, the same in both runners): a client that raises, or on Flower sends no
answer within ``timeout`` seconds, is skipped for that round and recorded in ``Transcript.failures`` with a
one-line reason (the client's own log keeps the traceback; the server gets ``"ValueError: ..."`` only). A
round with fewer than ``min_replies`` answers either stops the run with a one-line ``FederationError`` that
names every failed client (``on_short_round="fail"``, the default) or is skipped, the server state unchanged,
and recorded in ``Transcript.skipped_rounds`` (``"skip"``, xFedAlign's rule). The default needs every client.

Example:
    >>> import numpy as np
    >>> class Mean(FederatedAlgorithm):
    ...     def client_step(self, data, message, state, rnd):
    ...         if data is None:
    ...             raise ValueError("no data on this client")
    ...         return {"sum": data.sum(axis=0), "n": len(data)}, state
    ...     def aggregate(self, rnd, state, replies):
    ...         return sum(r["sum"] for r in replies.values()) / sum(r["n"] for r in replies.values())
    >>> run_in_process(Mean(), [np.ones((2, 3)), 3 * np.ones((2, 3))]).tolist()
    [2.0, 2.0, 2.0]
    >>> result, log = run_in_process(Mean(), [np.ones((2, 3)), None], transcript=True,
    ...                              policy=FailurePolicy(min_replies=1))
    >>> result.tolist(), log.failures
    ([1.0, 1.0, 1.0], [{1: 'raised ValueError: no data on this client'}])
    >>> run_in_process(Mean(), [np.ones((2, 3)), None], policy=FailurePolicy())
    Traceback (most recent call last):
    ...
    icml26.common.federation.FederationError: round 1: 1 of 2 clients answered, fewer than the 2 needed \
(min_replies); client 1 raised ValueError: no data on this client
"""

from __future__ import annotations

import copy
import json
import logging
import os
import pickle
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import tomllib
import traceback
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .io import atomic_open
from .optional import MissingExtraError, requires

Payload = dict[str, Any]
SCALARS = (bool, int, float, str)


def check_payload(payload: Any, where: str) -> Payload:
    """Raise ``TypeError`` unless ``payload`` is a flat dict of arrays and scalars (what Flower can carry)."""
    if not isinstance(payload, Mapping):
        raise TypeError(f"{where} must be a dict of arrays and scalars, got {type(payload).__name__}")
    for key, value in payload.items():
        if not isinstance(key, str):
            raise TypeError(f"{where}: keys must be strings, got {key!r}")
        if not isinstance(value, (np.ndarray, np.generic, *SCALARS)):
            raise TypeError(f"{where}[{key!r}] must be a NumPy array or a scalar, got {type(value).__name__}")
    return dict(payload)


class FederatedAlgorithm:
    """A federated method as pure functions; subclass and override ``client_step`` and ``aggregate``.

    Attributes:
        rounds: number of rounds.
        message_type: ``"query"`` for federated analytics, ``"train"`` for training (the Flower handler used).
    """

    rounds: int = 1
    message_type: str = "query"

    def initial_state(self, client_ids: Sequence[int]) -> Any:
        """The server's state before round 1."""
        return None

    def configure(self, rnd: int, state: Any, client_ids: Sequence[int]) -> dict[int, Payload]:
        """The message for every client in round ``rnd`` (default: the same empty message)."""
        return {cid: {} for cid in client_ids}

    def client_step(self, data: Any, message: Payload, state: dict[str, Any], rnd: int) -> tuple[Payload, dict[str, Any]]:
        """A client's answer to ``message`` from its ``data``, and its new private state."""
        raise NotImplementedError

    def aggregate(self, rnd: int, state: Any, replies: dict[int, Payload]) -> Any:
        """The server's new state from every client's answer."""
        raise NotImplementedError

    def result(self, state: Any) -> Any:
        """What the run returns (default: the final server state)."""
        return state


# ---------------------------------------------------------------------------------------------- failure policy
class FederationError(RuntimeError):
    """A federated run that could not finish. The message is one line; ``transcript`` holds what happened up
    to the failure (``None`` when the run never started)."""

    def __init__(self, message: str, transcript: Transcript | None = None):
        super().__init__(" ".join(_ANSI.sub("", str(message)).split()))
        self.transcript = transcript

    def __reduce__(self) -> tuple:  # survives pickling (the default would call __init__ without transcript)
        return (type(self), (str(self), self.transcript))


_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_FLOWER_REASON = re.compile(r"^<class '(?:[\w.]+\.)?(\w+)'>:<'(.*)'>$")


def one_line(what: BaseException | str, limit: int = 400) -> str:
    """An exception or a (possibly multi-line, ANSI-coloured) error text as one plain line.

    For text holding a traceback the last line (the exception) is kept, for other text the first; Flower's
    ``"<class 'ValueError'>:<'boom'>"`` becomes ``"ValueError: boom"``.

    Example:
        >>> one_line(ValueError("bad\\nvalue"))
        'ValueError: bad'
        >>> one_line("\\x1b[91mTraceback (most recent call last):\\n  File 'x'\\nKeyError: 'a'\\x1b[0m")
        "KeyError: 'a'"
    """
    if isinstance(what, BaseException):
        text = str(what).strip()
        first = _ANSI.sub("", text).splitlines()[0].strip() if text else ""
        line = f"{type(what).__name__}: {first}" if first else type(what).__name__
    else:
        lines = [s.strip() for s in _ANSI.sub("", str(what)).splitlines() if s.strip()]
        if not lines:
            return ""
        line = lines[-1] if any("Traceback (most recent call last)" in s for s in lines) else lines[0]
        match = _FLOWER_REASON.match(line)
        if match:
            line = f"{match.group(1)}: {match.group(2)}"
    return line if len(line) <= limit else line[: limit - 3] + "..."


@dataclass(frozen=True)
class FailurePolicy:
    """What a run does when clients fail or stay silent (see the module docstring).

    Run config keys of a Flower app (``from_run_config``): ``min-replies`` (0: every client),
    ``round-timeout``, ``on-short-round``.
    """

    min_replies: int | None = None
    """fewest answers a round needs (None: every client)"""
    timeout: float = 600.0
    """seconds a Flower round waits for answers; a client silent that long is skipped (in-process: unused)"""
    on_short_round: str = "fail"
    """below ``min_replies``: ``"fail"`` (FederationError) or ``"skip"`` (state unchanged, round recorded)"""

    def __post_init__(self) -> None:
        if self.min_replies is not None and (isinstance(self.min_replies, bool) or not isinstance(
                self.min_replies, int) or self.min_replies < 1):
            raise ValueError(f"min_replies must be None or an int >= 1, got {self.min_replies!r}")
        if not (isinstance(self.timeout, (int, float)) and np.isfinite(self.timeout) and self.timeout > 0):
            raise ValueError(f"timeout must be a finite number of seconds > 0, got {self.timeout!r}")
        if self.on_short_round not in ("fail", "skip"):
            raise ValueError(f"on_short_round must be 'fail' or 'skip', got {self.on_short_round!r}")

    def needed(self, n_clients: int) -> int:
        """Answers a round needs out of ``n_clients``."""
        return n_clients if self.min_replies is None else self.min_replies

    def apply(self, rnd: int, n_clients: int, replies: Mapping[int, Payload], failures: Mapping[int, str],
              log: Transcript) -> bool:
        """Record round ``rnd``'s failures in ``log`` and decide: True to aggregate ``replies``, False to skip
        the round (recorded), or raise ``FederationError``. Both runners call it; a Flower ``Strategy`` can too.

        Args:
            n_clients: clients that should have answered.
            replies: the answers that arrived, by client id.
            failures: why each other client did not answer, by client id (one line each).
        """
        log.failures.append(dict(sorted(failures.items())))
        needed = self.needed(n_clients)
        why = [f"client {cid} {reason}" for cid, reason in sorted(failures.items())] + log.lost_nodes
        if len(replies) >= needed:
            if failures:  # the server log names every dropped client, also when the round goes on without it
                logging.getLogger("flwr").warning("round %d: %s; aggregating the %d of %d answers", rnd,
                                                  "; ".join(why), len(replies), n_clients)
            return True
        message = (f"round {rnd}: {len(replies)} of {n_clients} clients answered, fewer than the {needed} "
                   "needed (min_replies)" + ("; " + "; ".join(why) if why else ""))
        if self.on_short_round == "skip":
            log.skipped_rounds.append(rnd)
            logging.getLogger("flwr").warning("%s; round skipped", message)
            return False
        raise FederationError(message, log)

    def to_run_config(self) -> dict[str, Any]:
        return {"min-replies": self.min_replies or 0, "round-timeout": float(self.timeout),
                "on-short-round": self.on_short_round}

    @classmethod
    def from_run_config(cls, run_config: Mapping[str, Any]) -> FailurePolicy:
        min_replies = int(run_config.get("min-replies", 0))
        return cls(min_replies=min_replies or None, timeout=float(run_config.get("round-timeout", 600.0)),
                   on_short_round=str(run_config.get("on-short-round", "fail")))


@dataclass
class Transcript:
    """What a run did, per round: ``messages[r][cid]`` (server to client), ``replies[r][cid]`` (back),
    ``failures[r][cid]`` (why a client was skipped), ``skipped_rounds`` (1-based rounds not aggregated), and
    ``lost_nodes`` (Flower nodes that never said which client they are, with why)."""

    messages: list[dict[int, Payload]] = field(default_factory=list)
    replies: list[dict[int, Payload]] = field(default_factory=list)
    failures: list[dict[int, str]] = field(default_factory=list)
    skipped_rounds: list[int] = field(default_factory=list)
    lost_nodes: list[str] = field(default_factory=list)


def run_in_process(algorithm: FederatedAlgorithm, client_data: Sequence[Any], *, transcript: bool = False,
                   policy: FailurePolicy | None = None) -> Any:
    """Run ``algorithm`` over ``client_data`` (one entry per client) in this process, clients in index order.

    Args:
        policy: None: a client's exception propagates as is (for debugging); a ``FailurePolicy``: a client that
            raises is skipped and recorded, as on Flower (its ``timeout`` does not apply in process).

    Returns the algorithm's ``result``, or ``(result, Transcript)`` with ``transcript=True``.
    """
    if len(client_data) == 0:
        raise ValueError("client_data must hold at least one client")
    ids = list(range(len(client_data)))
    state = algorithm.initial_state(ids)
    client_states: dict[int, dict[str, Any]] = {cid: {} for cid in ids}
    log = Transcript()
    for rnd in range(1, algorithm.rounds + 1):
        messages = algorithm.configure(rnd, state, ids)
        replies: dict[int, Payload] = {}
        failures: dict[int, str] = {}
        for cid in ids:
            message = check_payload(messages[cid], f"round {rnd} message to client {cid}")
            try:
                reply, new_state = algorithm.client_step(client_data[cid], copy.deepcopy(message),
                                                         client_states[cid], rnd)
                replies[cid] = check_payload(reply, f"round {rnd} reply of client {cid}")
                client_states[cid] = new_state
            except Exception as exc:
                if policy is None:
                    raise
                failures[cid] = f"raised {one_line(exc)}"
        if transcript:
            log.messages.append(copy.deepcopy(messages))
            log.replies.append(copy.deepcopy(replies))
        if policy is None:
            log.failures.append({})
        elif not policy.apply(rnd, len(ids), replies, failures, log):
            continue
        state = algorithm.aggregate(rnd, state, replies)
    result = algorithm.result(state)
    return (result, log) if transcript else result


# ----------------------------------------------------------------------------------------------- Flower apps
def check_fraction(name: str, value: Any) -> float:
    """A strategy's fraction argument (``fraction_train``, ...): a number in [0, 1], else a ValueError naming it."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
        raise ValueError(f"{name} must be a number in [0, 1], got {value!r}")
    return float(value)


def check_count(name: str, value: Any, low: int = 0) -> int:
    """A strategy's count argument (``min_train_nodes``, ...): an int >= ``low``, else a ValueError naming it."""
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
    return value


def sample_nodes(grid: Any, fraction: float, min_nodes: int, min_available: int, rng: Any,
                 wait: float = 1.0) -> tuple[list[int], list[int]]:
    """The nodes a Flower strategy trains this round: ``max(int(fraction * N), min_nodes)`` of the N connected
    nodes (sorted), drawn by ``rng`` (a ``random.Random``), after waiting for ``max(min_available, that many)``
    nodes (FedAvg's rule); returns (sampled, all connected)."""
    while True:
        nodes = sorted(grid.get_node_ids())
        # FedAvg's sample size: max(int(fraction * N), min_nodes)
        k = max(int(len(nodes) * fraction), min_nodes)
        if len(nodes) >= max(min_available, k):
            return sorted(rng.sample(nodes, k)), nodes
        logging.getLogger("flwr").info("Waiting for nodes to connect: %d connected (minimum required: %d).", len(nodes),
                                        max(min_available, k))
        time.sleep(wait)


class SampledConfigure:
    """``configure_train`` / ``configure_evaluate`` for a Flower Message-API strategy (a mixin placed before
    ``FedAvg``): sample nodes by FedAvg's rule (``sample_nodes``; none when the fraction is 0), remember them in
    ``self._sampled[kind, round]`` and send each the message ``self._messages(round, arrays, config, nodes,
    message_type)`` builds. The strategy sets ``fraction_train`` / ``fraction_evaluate``, ``min_train_nodes`` /
    ``min_evaluate_nodes``, ``min_available_nodes``, ``rng`` and ``_sampled``."""

    def configure_train(self, server_round: int, arrays: Any, config: Any, grid: Any) -> Any:
        return self._configure("train", server_round, arrays, config, grid)

    def configure_evaluate(self, server_round: int, arrays: Any, config: Any, grid: Any) -> Any:
        return self._configure("evaluate", server_round, arrays, config, grid)

    def _configure(self, kind: str, server_round: int, arrays: Any, config: Any, grid: Any) -> Any:
        from flwr.app import MessageType

        fraction = self.fraction_train if kind == "train" else self.fraction_evaluate
        if fraction == 0.0:
            return []
        min_nodes = self.min_train_nodes if kind == "train" else self.min_evaluate_nodes
        nodes, everyone = sample_nodes(grid, fraction, min_nodes, self.min_available_nodes, self.rng)
        logging.getLogger("flwr").info("configure_%s: Sampled %s nodes (out of %s)", kind, len(nodes), len(everyone))
        self._sampled[kind, server_round] = nodes
        message_type = MessageType.TRAIN if kind == "train" else MessageType.EVALUATE
        return self._messages(server_round, arrays, config, nodes, message_type)


def payload_to_records(payload: Payload) -> Any:
    """A payload as a Flower ``RecordDict``: arrays in an ``ArrayRecord``, scalars in a ``ConfigRecord``."""
    flwr_app = requires("flwr.app", extra="fl", purpose="running on Flower")
    arrays = {k: flwr_app.Array(np.ascontiguousarray(v)) for k, v in payload.items() if isinstance(v, (np.ndarray, np.generic))}
    scalars = {k: (v.item() if isinstance(v, np.generic) else v) for k, v in payload.items()
               if isinstance(v, SCALARS)}
    return flwr_app.RecordDict({"arrays": flwr_app.ArrayRecord(arrays), "scalars": flwr_app.ConfigRecord(scalars)})


def records_to_payload(records: Any) -> Payload:
    """The inverse of ``payload_to_records``."""
    out: Payload = {k: v.numpy() for k, v in records["arrays"].items()}
    out.update(dict(records["scalars"].items()))
    return out


def _store_state(records: Any, state: Payload) -> None:
    """Keep a client's private state in its Flower ``Context.state`` (a RecordDict of records)."""
    converted = payload_to_records(state)
    records["icml26_state_arrays"] = converted["arrays"]
    records["icml26_state_scalars"] = converted["scalars"]


def _load_state(records: Any) -> Payload:
    if "icml26_state_arrays" not in records:
        return {}
    out: Payload = {k: v.numpy() for k, v in records["icml26_state_arrays"].items()}
    out.update(dict(records["icml26_state_scalars"].items()))
    return out


MakeAlgorithm = Callable[[Mapping[str, Any]], FederatedAlgorithm]
"""Builds the algorithm from the run config (``context.run_config``); called on the server and every client."""
LoadData = Callable[[int, Mapping[str, Any], Mapping[str, Any]], Any]
"""``load_data(partition_id, node_config, run_config)``: a client's own data, read where its node keeps it."""

_HELLO, _ROUND, _PARTITION = "__hello", "__round", "__partition"


def flower_client_app(make_algorithm: MakeAlgorithm, load_data: LoadData) -> Any:
    """A Flower ``ClientApp`` that answers the server's messages with ``algorithm.client_step``.

    The node's client id is its ``partition-id`` (node config: set by the simulation engine, or by
    ``flower-supernode --node-config 'partition-id=0 ...'``). An exception in ``load_data`` or ``client_step``
    is logged with its traceback on the client and answered with a one-line ``Error`` (the policy's "raised").
    """
    requires("flwr", extra="fl", purpose="running on Flower")
    from flwr.app import Context, Error, Message
    from flwr.clientapp import ClientApp

    app = ClientApp()

    def handle(msg: Message, context: Context) -> Message:
        try:
            if "partition-id" not in context.node_config:
                raise KeyError("this SuperNode has no partition-id in its node config "
                               "(flower-supernode --node-config 'partition-id=0 ...')")
            cid = int(context.node_config["partition-id"])
            scalars = msg.content["scalars"]
            if _HELLO in scalars:  # the server maps node ids to clients first
                return Message(payload_to_records({_PARTITION: cid}), reply_to=msg)
            rnd = int(scalars[_ROUND])
            algorithm = make_algorithm(context.run_config)
            data = load_data(cid, context.node_config, context.run_config)
            message = {k: v for k, v in records_to_payload(msg.content).items() if k != _ROUND}
            reply, new_state = algorithm.client_step(data, message, _load_state(context.state), rnd)
            out = dict(check_payload(reply, f"round {rnd} reply of client {cid}"))
            _store_state(context.state, check_payload(new_state, f"client {cid} state"))
            out[_PARTITION] = cid
            return Message(payload_to_records(out), reply_to=msg)
        except Exception as exc:
            logging.getLogger("flwr").error("the client failed:\n%s", traceback.format_exc())
            return Message(Error(code=2, reason=one_line(exc)), reply_to=msg)  # 2: ClientApp raised

    app.query()(handle)
    app.train()(handle)
    return app


def _write_outcome(run_config: Mapping[str, Any], outcome: dict[str, Any]) -> None:
    path = str(run_config.get("result-path", ""))
    if path:
        with atomic_open(path, "wb") as fh:
            pickle.dump(outcome, fh)


def flower_server_app(make_algorithm: MakeAlgorithm, *, summary: Callable[[Any], str] | None = None) -> Any:
    """A Flower ``ServerApp`` that runs ``make_algorithm(run_config)`` over the connected SuperNodes.

    Run config keys it reads: ``num-clients`` (SuperNodes to wait for before round 1, all connected then take
    part; 0: those connected when the run starts), ``connect-timeout`` (seconds to wait for them, and for each
    to say which client it is), the policy's keys (``FailurePolicy.from_run_config``) and ``result-path``
    (where to pickle ``{"result", "transcript"}`` or ``{"error", "transcript"}`` for ``LocalFederation``; empty:
    nothing written). ``summary(result)`` is logged at the end; a failure is logged as one line and re-raised,
    so Flower marks the run failed.
    """
    requires("flwr", extra="fl", purpose="running on Flower")
    from flwr.app import Context, Message
    from flwr.serverapp import Grid, ServerApp

    app = ServerApp()
    logger = logging.getLogger("flwr")

    def wait_for_nodes(grid: Grid, wanted: int, timeout: float) -> list[int]:
        deadline = time.monotonic() + timeout
        nodes = sorted(grid.get_node_ids())
        while len(nodes) < max(wanted, 1) and time.monotonic() < deadline:  # SuperNodes connect asynchronously
            time.sleep(0.5)
            nodes = sorted(grid.get_node_ids())
        return nodes

    def partitions(grid: Grid, nodes: list[int], timeout: float, log: Transcript) -> dict[int, int]:
        """Ask every node which client (partition-id) it is; nodes that fail or stay silent are recorded."""
        hello = [Message(payload_to_records({_HELLO: True}), dst_node_id=node, message_type="query")
                 for node in nodes]
        client_of: dict[int, int] = {}
        failed: set[int] = set()
        for reply in grid.send_and_receive(hello, timeout=timeout):
            node = reply.metadata.src_node_id
            if reply.has_error():
                failed.add(node)
                log.lost_nodes.append(f"node {node} failed before round 1: {one_line(reply.error.reason or '')}")
                continue
            cid = int(records_to_payload(reply.content)[_PARTITION])
            if cid in client_of.values():
                raise FederationError(f"two SuperNodes say they are client {cid} (partition-id)", log)
            client_of[node] = cid
        for node in sorted(set(nodes) - set(client_of) - failed):
            log.lost_nodes.append(f"node {node} did not answer within {timeout:g} s before round 1")
        return client_of

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        run_config = context.run_config
        log = Transcript()
        try:
            algorithm = make_algorithm(run_config)
            policy = FailurePolicy.from_run_config(run_config)
            connect_timeout = float(run_config.get("connect-timeout", 120.0))
            wanted = int(run_config.get("num-clients", 0))
            nodes = wait_for_nodes(grid, wanted, connect_timeout)
            n_clients = max(wanted, len(nodes))
            if len(nodes) < wanted:
                log.lost_nodes.append(f"only {len(nodes)} of {wanted} SuperNodes connected within "
                                      f"{connect_timeout:g} s")
            if len(nodes) < policy.needed(n_clients):
                raise FederationError("; ".join(log.lost_nodes) or "no SuperNode connected", log)
            node_of = {cid: node for node, cid in partitions(grid, nodes, connect_timeout, log).items()}
            ids = sorted(node_of)
            state = algorithm.initial_state(ids)
            for rnd in range(1, algorithm.rounds + 1):
                messages = algorithm.configure(rnd, state, ids)
                out = []
                for cid in ids:
                    payload = check_payload(messages[cid], f"round {rnd} message to client {cid}")
                    out.append(Message(payload_to_records({**payload, _ROUND: rnd}), dst_node_id=node_of[cid],
                                       message_type=algorithm.message_type))
                cid_of = {node: cid for cid, node in node_of.items()}
                replies: dict[int, Payload] = {}
                failures: dict[int, str] = {}
                for reply in grid.send_and_receive(out, timeout=policy.timeout):
                    cid = cid_of[reply.metadata.src_node_id]
                    if reply.has_error():
                        failures[cid] = f"raised {one_line(reply.error.reason or 'an unknown error')}"
                    else:
                        answer = records_to_payload(reply.content)
                        answer.pop(_PARTITION, None)
                        replies[cid] = answer
                for cid in ids:
                    if cid not in replies and cid not in failures:
                        failures[cid] = f"did not answer within {policy.timeout:g} s"
                log.messages.append(copy.deepcopy(messages))
                log.replies.append({cid: replies[cid] for cid in sorted(replies)})
                if policy.apply(rnd, n_clients, replies, failures, log):
                    state = algorithm.aggregate(rnd, state, replies)
            result = algorithm.result(state)
            if summary is not None:
                logger.info("%s", summary(result))
            _write_outcome(run_config, {"result": result, "transcript": log})
        except Exception as exc:
            message = str(exc) if isinstance(exc, FederationError) else one_line(exc)
            logger.error("the federated run failed: %s", message)
            _write_outcome(run_config, {"error": message, "transcript": log})
            raise

    return app


# ----------------------------------------------------------------------------------------- local federation
def _program(name: str) -> str:
    """A Flower executable from this interpreter's environment (else from PATH)."""
    beside = Path(sys.executable).parent / name
    if beside.is_file():
        return str(beside)
    found = shutil.which(name)
    if found is None:
        raise MissingExtraError(f"the Flower program {name!r} is not installed; install it with: "
                                'pip install "icml26[fl]"')
    return found


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    return json.dumps(str(value))  # a TOML basic string


def _toml_pairs(config: Mapping[str, Any]) -> str:
    """``key=value`` pairs as Flower's ``--node-config`` / ``--federation-config`` read them."""
    return " ".join(f"{k}={_toml_value(v)}" for k, v in config.items())


@dataclass
class FlowerOutcome:
    """What a Flower run handed back: the algorithm's result, the transcript, and Flower's run id."""

    result: Any
    transcript: Transcript
    run_id: int


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    """Send ``sig`` to the process group ``proc`` leads (``start_new_session``); gone already is fine."""
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


class LocalFederation:
    """A Flower federation on this machine: a SuperLink and, for the deployment engine, one SuperNode per
    client, as subprocesses on free loopback ports, with their own Flower home directory.

    Args:
        node_configs: None: the SuperLink runs the simulation engine (Ray; ``run`` says how many SuperNodes);
            a list: the deployment engine, one ``flower-supernode --node-config`` per entry.
        home: the Flower home (``FLWR_HOME``: config, installed apps, logs); default: a temporary directory.
        num_cpus: CPUs the simulation engine may use (one per client at a time).
        startup_timeout: seconds to wait for the SuperLink to come up.

    Example (about a minute on two cores; see ``icml26.fedit.flower``):
        >>> with LocalFederation() as fed:                                                  # doctest: +SKIP
        ...     outcome = fed.run(app_dir, {"num-clients": 3}, num_supernodes=3)
    """

    connection = "icml26-local"
    status_checks = (120.0, 60.0)
    """seconds before the first ``flwr ls`` of a run, and between the next ones"""

    def __init__(self, node_configs: Sequence[Mapping[str, Any]] | None = None, *, home: str | Path | None = None,
                 num_cpus: int = 2, startup_timeout: float = 120.0):
        requires("flwr", extra="fl", purpose="running on Flower")
        self.node_configs = None if node_configs is None else [dict(c) for c in node_configs]
        self.num_cpus, self.startup_timeout = int(num_cpus), float(startup_timeout)
        self._tmp: tempfile.TemporaryDirectory | None = None
        self.home = Path(home) if home is not None else None
        self.port = 0
        self._procs: list[subprocess.Popen] = []
        self._runs = 0

    @property
    def simulation(self) -> bool:
        return self.node_configs is None

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update({"FLWR_HOME": str(self.home), "FLWR_DISABLE_UPDATE_CHECK": "1", "FLWR_TELEMETRY_ENABLED": "0",
                    "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1", "RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO": "0",
                    "PATH": f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"})
        return env

    def _spawn(self, cmd: list[str], name: str) -> subprocess.Popen:
        """Start ``cmd`` with its own Flower home ``home/name`` (as if on its own machine) and log file."""
        env = self._env()
        if name != "superlink":
            env["FLWR_HOME"] = str(self.home / name)
            (self.home / name).mkdir(exist_ok=True)
        with open(self.home / f"{name}.log", "ab") as log:
            # its own process group, so that close() also stops what it starts (the SuperLink's flwr-simulation)
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                    start_new_session=True)
        self._procs.append(proc)
        return proc

    def __enter__(self) -> LocalFederation:
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def start(self) -> None:
        """Start the SuperLink (and SuperNodes), write the ``flwr`` connection ``icml26-local``."""
        if self.home is None or self._tmp is not None:
            self._tmp = tempfile.TemporaryDirectory(prefix="icml26-flwr-")
            self.home = Path(self._tmp.name)
        self.home.mkdir(parents=True, exist_ok=True)
        self.port = _free_port()
        (self.home / "config.toml").write_text(
            f'[superlink]\ndefault = "{self.connection}"\n\n[superlink.{self.connection}]\n'
            f'address = "127.0.0.1:{self.port}"\ninsecure = true\n')
        cmd = [_program("flower-superlink"), "--insecure", "--host", "127.0.0.1", "--port", str(self.port),
               "--disable-runtime-dependency-installation"] + (["--simulation"] if self.simulation else [])
        link = self._spawn(cmd, "superlink")
        deadline = time.monotonic() + self.startup_timeout
        while True:
            if link.poll() is not None:
                self.close()
                raise FederationError(f"the Flower SuperLink exited with code {link.returncode} at start")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=1) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                self.close()
                raise FederationError(f"the Flower SuperLink did not come up within {self.startup_timeout:g} s")
            time.sleep(0.3)
        for k, node_config in enumerate(self.node_configs or []):
            self._spawn([_program("flower-supernode"), "--insecure", "--superlink", f"127.0.0.1:{self.port}",
                         "--port", str(_free_port()), "--node-config", _toml_pairs(node_config)],
                        f"supernode-{k}")

    def _flwr(self, *args: str, timeout: float = 120.0) -> dict[str, Any]:
        proc = subprocess.run([_program("flwr"), *args, "--format", "json"], capture_output=True, text=True,
                              env=self._env(), timeout=timeout, cwd=self.home)
        try:
            return json.loads(proc.stdout[proc.stdout.index("{"):])
        except ValueError:
            return {"success": False, "error-message": proc.stderr or proc.stdout or f"exit {proc.returncode}"}

    def _status(self, run_id: int) -> str:
        runs = self._flwr("ls", self.connection, "--run-id", str(run_id), timeout=60).get("runs") or [{}]
        return str(runs[0].get("status", ""))

    def run(self, app_dir: str | Path, run_config: Mapping[str, Any], *, num_supernodes: int | None = None,
            timeout: float = 900.0) -> FlowerOutcome:
        """``flwr run APP_DIR icml26-local`` with ``run_config`` overrides; wait for the ServerApp's outcome.

        Args:
            num_supernodes: simulation engine only: how many virtual SuperNodes (default: ``num-clients``).
            timeout: seconds for the whole run; then it is stopped and a ``FederationError`` raised.

        Raises:
            FederationError: one line: the run failed (too few answers, a bad config, ...), or timed out.
        """
        import tomli_w  # a dependency of flwr

        project = Path(app_dir) / "pyproject.toml"
        if not project.is_file():
            raise FileNotFoundError(f"{app_dir} is not a Flower App project: it has no pyproject.toml")
        declared = tomllib.loads(project.read_text()).get("tool", {}).get("flwr", {}).get("app", {}).get("config", {})
        unknown = sorted({*run_config, "result-path"} - set(declared))
        if unknown:  # flwr itself would only say "Invalid run configuration"
            raise ValueError(f"run config key(s) {', '.join(unknown)} are not declared in {project} "
                             "[tool.flwr.app.config]")
        if not self._procs:
            raise RuntimeError("start the LocalFederation first (use it in a with block)")
        self._runs += 1
        result_path = self.home / f"outcome-{self._runs}.pkl"
        config_path = self.home / f"run-config-{self._runs}.toml"
        config_path.write_text(tomli_w.dumps({**run_config, "result-path": str(result_path)}))
        args = ["run", str(Path(app_dir).resolve()), self.connection, "--run-config", str(config_path)]
        if self.simulation:
            n = int(num_supernodes or run_config.get("num-clients", 1))
            args += ["--federation-config", _toml_pairs({
                "num-supernodes": n, "client-resources-num-cpus": 1, "init-args-num-cpus": self.num_cpus,
                "init-args-log-to-driver": False})]
        started = self._flwr(*args)
        if not started.get("success"):
            lines = [s for s in str(started.get("error-message", "")).splitlines() if s.strip()]
            raise FederationError(f"flwr run failed: {one_line(lines[-1] if lines else 'no output')}")
        run_id = int(started["run-id"])
        # `flwr ls` costs seconds of CPU (10 s on two busy cores): ask rarely, only to catch a ServerApp that
        # died before writing its outcome (one that raises writes it)
        deadline, next_check = time.monotonic() + timeout, time.monotonic() + self.status_checks[0]
        while not result_path.exists():
            now = time.monotonic()
            if now > deadline:
                self._flwr("stop", str(run_id), self.connection, timeout=60)
                raise FederationError(f"the Flower run {run_id} did not finish within {timeout:g} s")
            if now > next_check:  # a ServerApp that crashed before writing its outcome
                status = self._status(run_id)
                if status.startswith("finished"):
                    time.sleep(2.0)
                    if not result_path.exists():
                        logs = f"see the logs under {self.home}" if self._tmp is None else "pass home= to keep the logs"
                        raise FederationError(f"the Flower run {run_id} ended ({status}) without an outcome; {logs}")
                next_check = now + self.status_checks[1]
            time.sleep(0.5)
        with open(result_path, "rb") as fh:
            outcome = pickle.load(fh)  # written by our own ServerApp under our own FLWR_HOME
        if "error" in outcome:
            raise FederationError(outcome["error"], outcome["transcript"])
        return FlowerOutcome(outcome["result"], outcome["transcript"], run_id)

    def close(self) -> None:
        """Stop the SuperNodes, then the SuperLink, each with every process it started (SIGTERM to its process
        group, then SIGKILL after 20 s); remove a temporary home."""
        for proc in reversed(self._procs):
            if proc.poll() is None:
                _signal_group(proc, signal.SIGTERM)
        for proc in reversed(self._procs):
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                _signal_group(proc, signal.SIGKILL)
                proc.wait(timeout=10)
            _signal_group(proc, signal.SIGKILL)  # children that outlived their parent (e.g. flwr-simulation)
        self._procs.clear()
        if self._tmp is not None:
            self._tmp.cleanup()


# ------------------------------------------------------------------------------------------ a paper's Flower App
DEMO = "demo"
"""``data-dir`` of the run config meaning "every client draws the paper's embedded data and keeps its part"."""
WriteClient = Callable[[Path, Any], Path]
"""``write_client(path, data)``: one client's data to an ``.npz`` its SuperNode reads (``data-path``); its path."""


def client_data_path(partition_id: int, node_config: Mapping[str, Any], run_config: Mapping[str, Any]) -> str | None:
    """Where client ``partition_id`` finds its data: its node's ``data-path``, else ``data-dir/client_<id>.npz``;
    None when ``data-dir`` is ``"demo"`` (the paper's embedded data). Raises ``ValueError`` when there is none."""
    path = str(node_config.get("data-path", ""))
    data_dir = str(run_config.get("data-dir", ""))
    if not path and data_dir and data_dir != DEMO:
        path = str(Path(data_dir) / f"client_{partition_id}.npz")
    if path:
        return path
    if data_dir == DEMO:
        return None
    raise ValueError("no data for this client: give its SuperNode --node-config 'data-path=\"...\"' or set "
                     "data-dir in the run config")


def demo_clients(partition_id: int, node_config: Mapping[str, Any], run_config: Mapping[str, Any],
                 n_clients: int | None = None, *, world: str = "demo federation") -> int:
    """Clients of the demo data (``n_clients``, else the simulation's ``num-partitions``, else the run config's
    ``num-clients``); raises ``ValueError`` when ``partition_id`` is not one of them."""
    k = n_clients or int(node_config.get("num-partitions", 0)) or int(run_config["num-clients"])
    if not 0 <= partition_id < k:
        raise ValueError(f"partition-id {partition_id} is outside the {world} of {k} clients")
    return k


def write_clients(clients: Sequence[Any], folder: str | Path, write_client: WriteClient) -> list[Path]:
    """``folder/client_<k>.npz`` for every client, written by ``write_client`` (``data-dir`` reads them)."""
    return [Path(write_client(Path(folder) / f"client_{k}.npz", data)) for k, data in enumerate(clients)]


def run_flower_app(app_dir: str | Path, run_config: Mapping[str, Any], clients: Sequence[Any],
                   write_client: WriteClient, *, engine: str = "simulation", timeout: float = 900.0,
                   num_cpus: int = 2, home: str | Path | None = None, prefix: str = "icml26-") -> FlowerOutcome:
    """Run the Flower App ``app_dir`` over ``clients`` on a local SuperLink, through ``flwr run``.

    Each client's data goes to its own file (``write_client``) in a temporary folder. ``engine="simulation"``:
    Flower's simulation engine (Ray), one virtual SuperNode per client, reading ``data-dir``;
    ``"deployment"``: one SuperNode process per client, given only its own file (``--node-config``).

    Args:
        run_config: the app's run config (``num-clients`` and the paper's settings); ``data-dir`` is set here.
        timeout: seconds for the whole run.
        home: Flower's home directory (its logs); default: a temporary one.
        prefix: of the temporary data folder's name.
    """
    if engine not in ("simulation", "deployment"):
        raise ValueError(f"engine must be 'simulation' or 'deployment', got {engine!r}")
    if len(clients) == 0:
        raise ValueError("clients must hold at least one client")
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        paths = write_clients(clients, tmp, write_client)
        if engine == "simulation":
            with LocalFederation(num_cpus=num_cpus, home=home) as federation:
                return federation.run(app_dir, {**run_config, "data-dir": tmp}, num_supernodes=len(clients),
                                      timeout=timeout)
        nodes = [{"partition-id": k, "data-path": str(p)} for k, p in enumerate(paths)]
        with LocalFederation(nodes, num_cpus=num_cpus, home=home) as federation:
            return federation.run(app_dir, {**run_config, "data-dir": ""}, timeout=timeout)
