"""A Flower ``Grid`` that runs the ``ClientApp`` in this process: the server app's fast path in tests."""

from __future__ import annotations

import pytest

pytest.importorskip("flwr")

from flwr.app import Context, RecordDict
from flwr.common.serde import message_from_proto, message_to_proto
from flwr.serverapp import Grid


class InlineGrid(Grid):
    """A ``Grid`` that hands each message to the ``ClientApp`` of its node in this process, both ways through
    Flower's wire format (protobuf), and returns the replies in reverse order. Node ``100 + k`` is client ``k``
    (its ``partition-id``, with its own ``Context.state``); ``silent[call]`` lists the clients whose reply never
    comes in that ``send_and_receive`` call (call 0: the harness's hello, then one call per round)."""

    def __init__(self, client_app, n_clients, run_config, silent=None):
        self.client_app, self.silent, self.calls = client_app, silent or {}, 0
        self.contexts = {100 + k: Context(run_id=1, node_id=100 + k, state=RecordDict(), run_config=run_config,
                                          node_config={"partition-id": k, "num-partitions": n_clients})
                         for k in range(n_clients)}

    def set_run(self, run):
        raise NotImplementedError

    @property
    def run(self):
        raise NotImplementedError

    def create_message(self, content, message_type, dst_node_id, group_id, ttl=None):
        raise NotImplementedError

    def get_node_ids(self):
        return list(self.contexts)

    def push_messages(self, messages):
        raise NotImplementedError

    def pull_messages(self, message_ids):
        raise NotImplementedError

    def send_and_receive(self, messages, *, timeout=None):
        call, self.calls = self.calls, self.calls + 1
        replies = []
        for msg in messages:
            node = msg.metadata.dst_node_id
            reply = self.client_app(message_from_proto(message_to_proto(msg)), self.contexts[node])
            if node - 100 not in self.silent.get(call, ()):
                replies.append(message_from_proto(message_to_proto(reply)))
        return replies[::-1]


class RecordingGrid(InlineGrid):
    """``InlineGrid`` that keeps a copy of every message and reply, turns a raising ClientApp into an error reply
    (as Flower's runtime does) and drops the replies of ``silent[(message_type, round)]`` (partition ids)."""

    def __init__(self, client_app, n_clients, run_config, silent=None):
        super().__init__(client_app, n_clients, run_config)
        self.drop, self.log = silent or {}, []

    def send_and_receive(self, messages, *, timeout=None):
        from flwr.app import Error, Message

        replies = []
        for msg in messages:
            sent = message_from_proto(message_to_proto(msg))
            node, kind = msg.metadata.dst_node_id, msg.metadata.message_type
            try:
                reply = self.client_app(message_from_proto(message_to_proto(msg)), self.contexts[node])
            except Exception as exc:
                reply = Message(Error(code=2, reason=str(exc)), reply_to=msg)
            rnd = int(sent.content["config"]["server-round"])
            if node - 100 in self.drop.get((kind, rnd), ()):
                reply = None
            else:
                reply = message_from_proto(message_to_proto(reply))
                replies.append(reply)
            self.log.append((kind, rnd, node, sent, reply))
        return replies[::-1]

    def sent(self, kind, rnd):
        """``{node: message}`` of the ``kind`` ("train", "evaluate") messages of round ``rnd``."""
        return {node: m for k, r, node, m, _ in self.log if k == kind and r == rnd}

    def got(self, kind, rnd):
        """``{node: reply}`` of the replies (no errors, none missing) to those messages."""
        return {node: m for k, r, node, _, m in self.log if k == kind and r == rnd and m is not None
                and not m.has_error()}

    def all_sent(self, kind):
        """Every ``kind`` message of the run, in order."""
        return [m for k, _, _, m, _ in self.log if k == kind]


def user_app_pyproject(config: str) -> str:
    """The ``pyproject.toml`` of a user's Flower App folder ``userapp`` (``server_app`` and ``client_app`` in
    ``userapp.py``), with ``config``: the ``[tool.flwr.app.config]`` lines."""
    return f"""
[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"

[project]
name = "userapp"
version = "1.0.0"
dependencies = []

[tool.hatch.build.targets.wheel]
packages = ["."]

[tool.flwr.app]
publisher = "someone"

[tool.flwr.app.components]
serverapp = "userapp:server_app"
clientapp = "userapp:client_app"

[tool.flwr.app.config]
{config.strip()}
"""
