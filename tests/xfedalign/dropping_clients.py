"""xFedAlign with clients that fail on purpose, as Flower apps (tests/xfedalign/test_flower.py).

Client 2 raises from round 2 on (a crash mid-run) and client 1 raises in round 3. The apps are built by the
harness from ``flower.algorithm_from_run_config(run_config, cls=DroppingXFedAlign)`` and ``flower.load_client``,
exactly as xFedAlign's own apps; the test copies this file beside a copy of xFedAlign's App ``pyproject.toml``
that names them, so it is imported as a top-level module there (absolute imports only).
"""

from __future__ import annotations

from functools import partial

from icml26.common.federation import flower_client_app, flower_server_app
from icml26.xfedalign.core import XFedAlign
from icml26.xfedalign.flower import algorithm_from_run_config, load_client, summary


class DroppingXFedAlign(XFedAlign):
    """Client 2 fails from round 2 on, client 1 in round 3."""

    def client_step(self, data, message, state, rnd):
        if data.cid == 2 and rnd >= 2:
            raise RuntimeError("client 2 went away")
        if data.cid == 1 and rnd == 3:
            raise RuntimeError("client 1 lost its disk")
        return super().client_step(data, message, state, rnd)


make_algorithm = partial(algorithm_from_run_config, cls=DroppingXFedAlign)
server_app = flower_server_app(make_algorithm, summary=summary)
client_app = flower_client_app(make_algorithm, load_client)
