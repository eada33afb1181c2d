"""xFedAlign as a Flower App (Message API) on the federation harness: ``server_app``, ``client_app``, ``run_local``.

``core.XFedAlign`` is a ``common.federation.FederatedAlgorithm``; the harness builds the Flower apps from it
(``flower_server_app`` / ``flower_client_app``), so a Flower run executes the same ``configure``,
``client_step`` and ``aggregate`` as ``run_in_process`` and gives bit-identical parameters and prior
(``tests/xfedalign/test_flower.py``). The Flower App project is the folder ``flower_app/`` beside this module: its
``pyproject.toml`` names ``icml26.xfedalign.flower:server_app`` and ``icml26.xfedalign.flower:client_app`` and
holds the run config (the algorithm's settings, the failure policy, where the data is). Run it with ``flwr run``
on a SuperLink whose environment, and every SuperNode's, has ``icml26[xfedalign]`` installed.

- down (``train`` messages): the global parameters (``param/<name>``), the (C, G) prior (float32), ``beta`` and
  the run's ``seed``; up: the client's parameters, its sample count and its artifact (``SparseArtifact``'s
  payload: C k indices and 8-bit values, a scale, its noised class-presence bits), nothing else;
- the server averages the parameters in client-id order (``models.fedavg``, Flower's own float32 arithmetic)
  and folds the artifacts into the prior (``XFedAlign.aggregate_explanations``);
- a client's data: ``--node-config 'partition-id=K data-path="client.npz"'`` on its SuperNode (``write_client``
  writes one), or, under the simulation engine, ``data-dir`` in the run config holding ``client_<id>.npz``, or
  ``data-dir = "demo"`` (the default): every client builds the same embedded world (``data.load_task`` with
  ``dataset``, ``partition``, ``data-seed`` and as many clients as SuperNodes) and keeps its own part.

**Failures: xFedAlign's drop rule** is the harness's ``FailurePolicy`` with ``on_short_round="skip"``
(``drop_policy``): a client that raises, or sends nothing within ``round-timeout`` seconds, is skipped for that
round and named in ``Transcript.failures``; a round with fewer than ``min-replies`` answers (0: every client) is
skipped, model and prior unchanged, and listed in ``Transcript.skipped_rounds``. ``run_in_process(algorithm,
clients, policy=drop_policy(...))`` applies the same rule in process.

Example (a Flower simulation through a local SuperLink, about a minute on two cores: Ray starts first):
    >>> from icml26.xfedalign import XFedAlign
    >>> from icml26.xfedalign.data import load_task
    >>> from icml26.xfedalign.models import ModelSpec
    >>> task = load_task("cancer", "iid", n_clients=3, seed=0)
    >>> algo = XFedAlign(ModelSpec(30, 2, 16), task.groups, rounds=2, topk=4)
    >>> outcome = run_local(algo, task.clients, policy=drop_policy(min_replies=2))     # doctest: +SKIP
    >>> outcome.result["prior"].shape, outcome.transcript.skipped_rounds               # doctest: +SKIP
    ((2, 10), [])
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..common import federation
from ..common.federation import (
    DEMO,
    FailurePolicy,
    FlowerOutcome,
    client_data_path,
    demo_clients,
    flower_client_app,
    flower_server_app,
    run_flower_app,
)
from ..common.optional import requires
from .core import XFedAlign
from .data import ClientData, GroupSpec, cancer_groups, load_task, patch_groups
from .models import ModelSpec

requires("flwr", extra="xfedalign", purpose="the Flower App of xfedalign")

APP_DIR = Path(__file__).with_name("flower_app")
"""The Flower App project (``flwr run`` takes this folder)."""
DEMO_SHAPES = {"cancer": (30, 2), "digits": (64, 10)}
"""(features, classes) of the embedded worlds (``data.load_task``)."""
NAMED_GROUPS = {"cancer": cancer_groups, "digits": lambda: patch_groups(8, 8, 2)}
"""``groups`` in the run config may name the groups of an embedded world."""


def drop_policy(min_replies: int | None = None, *, timeout: float = 600.0) -> FailurePolicy:
    """xFedAlign's drop rule as the harness's ``FailurePolicy``: failed or silent clients are skipped and
    recorded; a round with fewer than ``min_replies`` answers (None: every client) is skipped, model and prior
    unchanged, and recorded (``on_short_round="skip"``). ``timeout``: seconds a Flower round waits."""
    return FailurePolicy(min_replies=min_replies, timeout=timeout, on_short_round="skip")


# ------------------------------------------------------------------------------------------------ run config
def groups_from_run_config(value: str) -> GroupSpec:
    """``"cancer"`` / ``"digits"`` (an embedded world's groups) or a JSON list of lists of feature indices."""
    if value in NAMED_GROUPS:
        return NAMED_GROUPS[value]()
    why = (f"groups must be {' or '.join(map(repr, NAMED_GROUPS))} or a JSON list of lists of feature indices, "
           f"got {value[:80]!r}")
    try:
        groups = json.loads(value)
    except json.JSONDecodeError:
        raise ValueError(why) from None
    if not (isinstance(groups, list) and all(
            isinstance(g, list) and all(isinstance(j, int) and not isinstance(j, bool) for j in g) for g in groups)):
        raise ValueError(why)
    flat = [j for g in groups for j in g]
    return GroupSpec(tuple(tuple(g) for g in groups), max(flat, default=-1) + 1)


def algorithm_from_run_config(run_config: Mapping[str, Any], cls: type[XFedAlign] = XFedAlign) -> XFedAlign:
    """The ``XFedAlign`` (or subclass ``cls``) the run config describes; the inverse of ``run_config_of``."""
    if not (isinstance(cls, type) and issubclass(cls, XFedAlign)):
        raise TypeError(f"cls must be XFedAlign or a subclass, got {cls!r}")
    groups = groups_from_run_config(str(run_config["groups"]))
    n_classes = int(run_config["n-classes"])
    if str(run_config.get("data-dir", "")) == DEMO:
        dataset = str(run_config["dataset"])
        if dataset not in DEMO_SHAPES:
            raise ValueError(f"dataset must be one of {tuple(DEMO_SHAPES)}, got {dataset!r}")
        if (groups.n_features, n_classes) != DEMO_SHAPES[dataset]:
            raise ValueError(f"the demo data ({dataset!r}) has (features, classes) = {DEMO_SHAPES[dataset]}, but "
                             f"groups and n-classes describe {(groups.n_features, n_classes)}")
    spec = ModelSpec(groups.n_features, n_classes, int(run_config["hidden"]))
    return cls(spec, groups, topk=int(run_config["topk"]), noise_sigma=float(run_config["noise-sigma"]),
               quant_bits=int(run_config["quant-bits"]), temperature=float(run_config["temperature"]),
               surrogate_l1=float(run_config["surrogate-l1"]), surrogate_iters=int(run_config["surrogate-iters"]),
               aggregation=str(run_config["aggregation"]), trim=float(run_config["trim"]),
               ema=float(run_config["ema"]), beta=float(run_config["beta"]),
               min_class_count=int(run_config["min-class-count"]), rounds=int(run_config["rounds"]),
               lr=float(run_config["lr"]), local_epochs=int(run_config["local-epochs"]),
               batch_size=int(run_config["batch-size"]), momentum=float(run_config["momentum"]),
               l1=float(run_config["l1"]), seed=int(run_config["seed"]))


def run_config_of(algorithm: XFedAlign, n_clients: int, policy: FailurePolicy | None = None) -> dict[str, Any]:
    """The run config that makes the app run ``algorithm`` over ``n_clients`` clients with ``policy``
    (default: ``drop_policy()``, every client needed, a short round skipped)."""
    if not isinstance(algorithm, XFedAlign):
        raise TypeError(f"algorithm must be an XFedAlign, got {type(algorithm).__name__}")
    a = algorithm
    return {"num-clients": int(n_clients), "groups": json.dumps([list(g) for g in a.groups.groups]),
            "n-classes": int(a.spec.n_classes), "hidden": int(a.spec.hidden), "topk": int(a.topk),
            "noise-sigma": float(a.noise_sigma), "quant-bits": int(a.quant_bits), "temperature": float(a.temperature),
            "surrogate-l1": float(a.surrogate_l1), "surrogate-iters": int(a.surrogate_iters),
            "aggregation": str(a.aggregation), "trim": float(a.trim), "ema": float(a.ema), "beta": float(a.beta),
            "min-class-count": int(a.min_class_count), "rounds": int(a.rounds), "lr": float(a.lr),
            "local-epochs": int(a.local_epochs), "batch-size": int(a.batch_size), "momentum": float(a.momentum),
            "l1": float(a.l1), "seed": int(a.seed), **(policy or drop_policy()).to_run_config()}


# ------------------------------------------------------------------------------------------------ client data
def write_client(path: str | Path, data: ClientData) -> Path:
    """Write one client's ``ClientData`` to an ``.npz`` its SuperNode can read (``data-path``)."""
    path = Path(path)
    np.savez(path, X_train=data.X_train, y_train=data.y_train, X_val=data.X_val, y_val=data.y_val,
             X_test=data.X_test, y_test=data.y_test, cid=np.int64(data.cid), shift=np.str_(data.shift),
             attacker=np.int64(-1 if data.attacker is None else data.attacker),
             **{f"rows_{split}": rows for split, rows in data.rows.items()})
    return path if path.suffix == ".npz" else path.with_name(path.name + ".npz")


def read_client(path: str | Path, partition_id: int) -> ClientData:
    """A client's data from an ``.npz`` with ``X_train`` (n, d) and integer ``y_train`` (n,); ``cid`` (the seed
    of its local randomness; default: ``partition_id``), the validation/test splits and the rest are optional."""
    with np.load(path) as arrays:
        if "X_train" not in arrays or "y_train" not in arrays:
            raise ValueError(f"{path}: needs the arrays X_train and y_train, has {sorted(arrays.files)}")
        got = {k: arrays[k] for k in arrays.files}
    X, y = got["X_train"], got["y_train"]
    if X.ndim != 2 or y.ndim != 1 or len(X) != len(y):
        raise ValueError(f"{path}: X_train must be (n, d) and y_train (n,), got {X.shape} and {y.shape}")
    if not np.issubdtype(y.dtype, np.integer):
        raise ValueError(f"{path}: y_train must hold integer class labels, got dtype {y.dtype}")
    empty_X, empty_y = np.zeros((0, X.shape[1]), dtype=X.dtype), np.zeros(0, dtype=y.dtype)
    attacker = int(got.get("attacker", -1))
    return ClientData(X, y, got.get("X_val", empty_X), got.get("y_val", empty_y), got.get("X_test", empty_X),
                      got.get("y_test", empty_y), shift=str(got.get("shift", "none")),
                      cid=int(got.get("cid", partition_id)), attacker=None if attacker < 0 else attacker,
                      rows={k.removeprefix("rows_"): v for k, v in got.items() if k.startswith("rows_")})


def write_clients(clients: Sequence[ClientData], folder: str | Path) -> list[Path]:
    """``folder/client_<k>.npz`` for every client (``data-dir`` in the run config reads them)."""
    return federation.write_clients(clients, folder, write_client)


def load_client(partition_id: int, node_config: Mapping[str, Any], run_config: Mapping[str, Any]) -> ClientData:
    """This client's data: its node's ``data-path``, else ``data-dir/client_<id>.npz``, else the demo world."""
    path = client_data_path(partition_id, node_config, run_config)
    if path:
        return read_client(path, partition_id)
    k = demo_clients(partition_id, node_config, run_config)
    logging.getLogger("flwr").info("client %d: the demo data (%s)", partition_id, run_config["dataset"])
    task = load_task(str(run_config["dataset"]), str(run_config["partition"]), n_clients=k,
                     seed=int(run_config["data-seed"]))
    return task.clients[partition_id]


def summary(result: Mapping[str, Any]) -> str:
    """One log line for the result (the final server state: ``params``, ``prior``, ``bytes``)."""
    done = result["bytes"]
    if not done:
        return "xFedAlign: no round was aggregated (every round was short; see the transcript's failures)"
    return (f"xFedAlign: {len(done)} round(s) aggregated, {done[-1]['clients']} clients in the last; prior "
            f"{tuple(result['prior'].shape)}; explanation channel {done[-1]['explain_up']:.0f} B up per client")


server_app = flower_server_app(algorithm_from_run_config, summary=summary)
"""The ``ServerApp`` (``[tool.flwr.app.components] serverapp``)."""
client_app = flower_client_app(algorithm_from_run_config, load_client)
"""The ``ClientApp`` (``[tool.flwr.app.components] clientapp``)."""


def run_local(algorithm: XFedAlign, clients: Sequence[ClientData], *, policy: FailurePolicy | None = None,
              engine: str = "simulation", timeout: float = 900.0, num_cpus: int = 2,
              home: str | Path | None = None, app_dir: str | Path = APP_DIR) -> FlowerOutcome:
    """Run ``algorithm`` over ``clients`` with the Flower App on a local SuperLink, through ``flwr run``.

    Args:
        policy: the failure policy (default: ``drop_policy()``: every client needed, a short round skipped).
        engine: ``"simulation"`` (Flower's simulation engine, Ray) or ``"deployment"`` (one SuperNode process
            per client, each given only its own data file through ``--node-config``).
        timeout: seconds for the whole run.
        home: Flower's home directory (its logs); default: a temporary one.
        app_dir: the Flower App project: xFedAlign's, or one whose apps build a subclass with
            ``algorithm_from_run_config(run_config, cls=...)`` and declare the same run config.

    Returns:
        ``FlowerOutcome``: ``result`` (the final state, as ``run_in_process``: ``params``, ``prior``, ``bytes``),
        the ``transcript`` (what every client sent, who failed, which rounds were skipped) and Flower's run id.
    """
    return run_flower_app(app_dir, run_config_of(algorithm, len(clients), policy), clients, write_client,
                          engine=engine, timeout=timeout, num_cpus=num_cpus, home=home, prefix="icml26-xfedalign-")
