"""The federation harness shared by the federated papers (fedit, xfedalign, fedtreelora).

A federated method is written once, framework-free, as a ``FederatedAlgorithm``: the server configures a
message for every client, each client answers from its local data (and its private state, kept across
rounds), the server aggregates the answers; repeat for ``rounds`` rounds. Messages and answers are
``Payload``s: flat dicts of NumPy arrays and scalars (int, float, str, bool) — what Flower's records carry.

Two runners execute the same algorithm:

- ``run_in_process``: clients in a fixed order in this process; fast and deterministic (quick/full modes, CI).
  With ``transcript=True`` it also returns what every client sent (the "only aggregates leave a client" check).
- ``run_flower``: a real Flower simulation (Message API, ``flwr.serverapp.ServerApp`` with ``@main``,
  ``flwr.clientapp.ClientApp`` with ``@query`` / ``@train``, Ray backend); clients see only their own partition
  (``context.node_config["partition-id"]``) and keep their state in ``context.state``. It costs a fixed
  startup of several seconds to ~40 s (Ray), so it is used for one agreement test per paper, not in the runs.

Example:
    >>> import numpy as np
    >>> class Mean(FederatedAlgorithm):
    ...     def client_step(self, data, message, state, rnd):
    ...         return {"sum": data.sum(axis=0), "n": len(data)}, state
    ...     def aggregate(self, rnd, state, replies):
    ...         return sum(r["sum"] for r in replies.values()) / sum(r["n"] for r in replies.values())
    >>> run_in_process(Mean(), [np.ones((2, 3)), 3 * np.ones((2, 3))]).tolist()
    [2.0, 2.0, 2.0]
"""

from __future__ import annotations

import copy
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .optional import requires

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


@dataclass
class Transcript:
    """Every payload sent, per round: ``messages[r][cid]`` (server to client), ``replies[r][cid]`` (back)."""

    messages: list[dict[int, Payload]] = field(default_factory=list)
    replies: list[dict[int, Payload]] = field(default_factory=list)


def run_in_process(algorithm: FederatedAlgorithm, client_data: Sequence[Any], *, transcript: bool = False
                   ) -> Any:
    """Run ``algorithm`` over ``client_data`` (one entry per client) in this process, clients in index order.

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
        for cid in ids:
            message = check_payload(messages[cid], f"round {rnd} message to client {cid}")
            reply, client_states[cid] = algorithm.client_step(client_data[cid], copy.deepcopy(message),
                                                              client_states[cid], rnd)
            replies[cid] = check_payload(reply, f"round {rnd} reply of client {cid}")
        if transcript:
            log.messages.append(copy.deepcopy(messages))
            log.replies.append(copy.deepcopy(replies))
        state = algorithm.aggregate(rnd, state, replies)
    result = algorithm.result(state)
    return (result, log) if transcript else result


# ----------------------------------------------------------------------------------------------- Flower adapter
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


def run_flower(algorithm: FederatedAlgorithm, client_data: Sequence[Any], *, num_cpus: int = 2,
               timeout: float = 600.0, verbose: bool = False) -> Any:
    """Run ``algorithm`` as a Flower simulation with one SuperNode per entry of ``client_data``.

    Clients only ever see their own partition; the server only sees what clients answer. Requires the ``fl``
    extra (``flwr[simulation]``).
    """
    requires("flwr", extra="fl", purpose="running on Flower")
    os.environ.setdefault("FLWR_DISABLE_UPDATE_CHECK", "1")
    os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")  # silences a Ray FutureWarning (no GPUs)
    from flwr.app import Context, Message
    from flwr.clientapp import ClientApp
    from flwr.serverapp import Grid, ServerApp
    from flwr.simulation import run_simulation

    n_clients = len(client_data)
    if n_clients == 0:
        raise ValueError("client_data must hold at least one client")
    client_app = ClientApp()

    def handle(msg: Message, context: Context) -> Message:
        cid = int(context.node_config["partition-id"])
        if "__hello" in msg.content["scalars"]:  # the server maps node ids to partitions first
            return Message(content=payload_to_records({"__partition": cid}), reply_to=msg)
        rnd = int(msg.content["scalars"]["__round"])
        state = _load_state(context.state)
        message = {k: v for k, v in records_to_payload(msg.content).items() if k != "__round"}
        reply, new_state = algorithm.client_step(client_data[cid], message, state, rnd)
        _store_state(context.state, check_payload(new_state, f"client {cid} state"))
        out = dict(check_payload(reply, f"round {rnd} reply of client {cid}"))
        out["__partition"] = cid
        return Message(content=payload_to_records(out), reply_to=msg)

    client_app.query()(handle)
    client_app.train()(handle)

    outcome: dict[str, Any] = {}
    server_app = ServerApp()

    @server_app.main()
    def main(grid: Grid, context: Context) -> None:
        try:
            deadline = time.monotonic() + timeout
            nodes = list(grid.get_node_ids())
            while len(nodes) < n_clients:  # SuperNodes register asynchronously
                if time.monotonic() > deadline:
                    raise TimeoutError(f"only {len(nodes)} of {n_clients} Flower nodes registered")
                time.sleep(0.1)
                nodes = list(grid.get_node_ids())
            hello = [Message(content=payload_to_records({"__hello": True}), dst_node_id=node, message_type="query")
                     for node in nodes]
            partition_of = {reply.metadata.src_node_id: int(records_to_payload(reply.content)["__partition"])
                            for reply in grid.send_and_receive(hello, timeout=timeout)}
            if sorted(partition_of.values()) != list(range(n_clients)):
                raise RuntimeError(f"Flower nodes reported partitions {sorted(partition_of.values())}")
            node_of = {cid: node for node, cid in partition_of.items()}
            ids = list(range(n_clients))
            state = algorithm.initial_state(ids)
            for rnd in range(1, algorithm.rounds + 1):
                messages = algorithm.configure(rnd, state, ids)
                out = []
                for cid in ids:
                    content = payload_to_records({**check_payload(messages[cid], f"round {rnd} message to client {cid}"),
                                                  "__round": rnd})
                    out.append(Message(content=content, dst_node_id=node_of[cid], message_type=algorithm.message_type))
                replies: dict[int, Payload] = {}
                for reply in grid.send_and_receive(out, timeout=max(1.0, deadline - time.monotonic())):
                    if reply.has_error():
                        raise RuntimeError(f"a Flower client failed: {reply.error}")
                    payload = records_to_payload(reply.content)
                    replies[int(payload.pop("__partition"))] = payload
                if len(replies) != n_clients:
                    raise RuntimeError(f"round {rnd}: {len(replies)} of {n_clients} clients answered")
                state = algorithm.aggregate(rnd, state, replies)
            outcome["result"] = algorithm.result(state)
        except BaseException as exc:  # surfaced to the caller below
            outcome["error"] = exc

    backend = {"client_resources": {"num_cpus": 1}, "init_args": {"log_to_driver": verbose, "num_cpus": num_cpus}}
    run_simulation(server_app=server_app, client_app=client_app, num_supernodes=n_clients,
                   backend_config=backend, verbose_logging=verbose)
    if "error" in outcome:
        raise RuntimeError(f"the Flower run failed: {outcome['error']!r}") from outcome["error"]
    if "result" not in outcome:
        raise RuntimeError("the Flower run ended without a result")
    return outcome["result"]

