"""FedIT as a Flower App (Message API): ``server_app``, ``client_app``, and ``run_local`` to run it from Python.

The Flower App project is the folder ``flower_app/`` beside this module: its ``pyproject.toml`` names
``icml26.fedit.flower:server_app`` and ``icml26.fedit.flower:client_app`` and holds the run config (the test's
settings, the failure policy, where the data is). Run it with ``flwr run`` on any SuperLink whose environment,
and every SuperNode's, has ``icml26[fedit]`` installed (see the README's usage section):

- the server sends the settings and a per-client seed; each client loads only its own ``(X, Y)`` and answers
  with ``FedITQuery.client_step`` (its statistic and null moments or permuted statistics, nothing else);
  the server stacks the answers with ``core.aggregate`` and logs ``S`` and the p-value;
- a client's data: ``--node-config 'partition-id=K data-path="client.npz"'`` on its SuperNode (an ``.npz``
  with arrays ``X`` and ``Y``); or, under the simulation engine, ``data-dir`` in the run config holding
  ``client_<partition-id>.npz``; or ``data-dir = "demo"`` (the default): every client draws the same synthetic
  federation (``data.shared_shifts`` with ``num-partitions`` clients, else ``num-clients``) and keeps its part;
- failures (``common.federation.FailurePolicy``): ``min-replies`` (0: every client must answer),
  ``round-timeout`` and ``on-short-round`` in the run config; a client that raises or stays silent is skipped
  and named in the transcript, and the test is computed over the clients that answered.

``run_local(query, clients)`` writes each client's data to its own file, starts a local SuperLink (and, for
``engine="deployment"``, one SuperNode per client) on loopback ports, runs the app with ``flwr run`` and returns
the result and the transcript (``common.federation.run_flower_app``; ``FederatedIndependenceTest(runner="flower")``
runs the same app the same way). The query's run config (``query_from_run_config``, ``run_config_of``) lives in
``test.py``, the component below this module (this module imports it, never the reverse).

Example (about a minute on two cores: Flower's simulation engine starts Ray first):
    >>> from icml26.fedit import FedITQuery
    >>> from icml26.fedit.data import shared_shifts
    >>> import numpy as np
    >>> query = FedITQuery(copula=True, null="gamma", n_permutations=0, random_features=None, privacy=None, seed=1)
    >>> outcome = run_local(query, shared_shifts(np.random.default_rng(0), K=3))   # doctest: +SKIP
    >>> stats, test = outcome.result                                                # doctest: +SKIP
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..common.federation import (
    FailurePolicy,
    FlowerOutcome,
    client_data_path,
    demo_clients,
    flower_client_app,
    flower_server_app,
    run_flower_app,
)
from ..common.optional import requires
from .data import shared_shifts
from .test import APP_DIR, FedITQuery, check_clients, query_from_run_config, run_config_of, write_client

requires("flwr", extra="fedit", purpose="the Flower App of fedit")

def load_client(partition_id: int, node_config: Mapping[str, Any], run_config: Mapping[str, Any]
                ) -> tuple[np.ndarray, np.ndarray]:
    """This client's ``(X, Y)``: its node's ``data-path``, else ``data-dir/client_<id>.npz``, else the demo."""
    path = client_data_path(partition_id, node_config, run_config)
    if path:
        with np.load(path) as arrays:
            X, Y = arrays["X"], arrays["Y"]
    else:
        k = demo_clients(partition_id, node_config, run_config)
        logging.getLogger("flwr").info("client %d: the demo data (shared_shifts)", partition_id)
        X, Y = shared_shifts(np.random.default_rng(int(run_config["demo-seed"])), K=k,
                             dep=float(run_config["demo-dependence"]))[partition_id]
    try:
        ((X, Y),) = check_clients([(X, Y)])
    except ValueError as exc:  # check_clients counts from 0 within its list; name the file instead
        raise ValueError(f"{path or 'demo data'}: {str(exc).removeprefix('client 0: ')}") from None
    if float(run_config.get("epsilon", 0.0)) > 0 and (X.shape[1] != 1 or Y.shape[1] != 1):
        raise ValueError("privacy mode supports 1-D X and Y (only then are the null moments free of data)")
    return X, Y


def summary(result: Any) -> str:
    """One log line for the result (``FedITQuery.result``: the clients' statistics and the test)."""
    stats, test = result
    return (f"FedIT over {len(stats)} clients: S = {test.statistic:.6g}, p-value = {test.pvalue:.4g} "
            f"({test.null} null)")


server_app = flower_server_app(query_from_run_config, summary=summary)
"""The ``ServerApp`` (``[tool.flwr.app.components] serverapp``)."""
client_app = flower_client_app(query_from_run_config, load_client)
"""The ``ClientApp`` (``[tool.flwr.app.components] clientapp``)."""


def run_local(query: FedITQuery, clients: Sequence[tuple[np.ndarray, np.ndarray]], *, engine: str = "simulation",
              policy: FailurePolicy | None = None, timeout: float = 900.0, num_cpus: int = 2) -> FlowerOutcome:
    """Run ``query`` over ``clients`` with the Flower App on a local SuperLink, through ``flwr run``.

    Args:
        engine: ``"simulation"`` (Flower's simulation engine, Ray) or ``"deployment"`` (one SuperNode process
            per client, each given only its own data file through ``--node-config``).
        policy: the failure policy (default: every client must answer within 600 s).
        timeout: seconds for the whole run.

    Returns:
        ``FlowerOutcome``: ``result`` (``(client statistics, TestResult)``, as ``run_in_process``), the
        ``transcript`` (what every client sent, who failed) and Flower's run id.
    """
    return run_flower_app(APP_DIR, run_config_of(query, len(clients), policy), clients, write_client, engine=engine,
                          timeout=timeout, num_cpus=num_cpus, prefix="icml26-fedit-")
