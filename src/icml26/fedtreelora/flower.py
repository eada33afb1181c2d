"""FedTreeLoRA as a Flower App (Message API) on the federation harness: ``server_app``, ``client_app``, ``run_local``.

``core.FedTreeLoRA`` (and every baseline of ``baselines``) is a ``common.federation.FederatedAlgorithm``; the
harness builds the Flower apps from it (``flower_server_app`` / ``flower_client_app``), so a Flower run executes
the same ``configure``, ``client_step`` and ``aggregate`` as ``run_in_process`` and gives bit-identical adapters,
tree, cuts and per-item outcomes (``tests/fedtreelora/test_flower.py``). The Flower App project is the folder
``flower_app/`` beside this module: its ``pyproject.toml`` names ``icml26.fedtreelora.flower:server_app`` and
``icml26.fedtreelora.flower:client_app`` and holds the run config (the arm and its settings, the base model's
directory, the failure policy, where the data is). Run it with ``flwr run`` on a SuperLink whose environment,
and every SuperNode's, has ``icml26[fedtreelora]`` installed.

Personalised aggregation: the server sends **every node its own message** (``train`` messages; Flower node ids
are mapped to clients by their ``partition-id`` first):

- down: the node's cluster experts (``clus/<peft key>``: the starting point of the adapters it trains) and
  external experts (``ext/<peft key>``: the frozen average of the other clients, mixed in through its gate),
  only for the layers its rule shares (nothing during the warm-up), and the phase (``train`` / ``eval``);
- up: the adapters the rule asks for (``lora/<peft key>``; FedTreeLoRA: all of them from the last warm-up
  round on, for the tree) and the client's number of examples; in the last (evaluation) round its per-item
  correctness on its validation and test splits and its mean gate. Private adapters and gates stay in
  ``context.state``;
- the server builds the tree and the per-layer cuts once, after the warm-up, and the next round's per-client
  experts (``core.aggregate_tree_lora``).

The base model: ``model-path`` in the run config, a directory with a causal LM and its tokenizer
(``save_pretrained``; ``LoRATrainer.from_pretrained`` loads it with eager attention, frozen), read by the server
(for the adapter names) and by every client; ``"demo"``: the reproduction's pretrained tiny Llama
(``experiment.base_model``, cached in ``~/.cache/icml26``; a miss pretrains it, about two minutes). Each process
keeps one adapted model per setting (``trainer_from_run_config``), as a device would.

A client's data (``ClientData``: token ids of equal-length prompts ending in the answer position, and class
labels): ``--node-config 'partition-id=K data-path="client.npz"'`` on its SuperNode (``write_client`` writes one),
or, under the simulation engine, ``data-dir`` in the run config holding ``client_<id>.npz``, or ``data-dir =
"demo"`` (the default): every client draws the embedded world (``data.World``, 8 clients, ``data-seed``) and
keeps its part. Failures: the harness's ``FailurePolicy`` (``min-replies``, ``round-timeout``, ``on-short-round``).

Example (a Flower simulation through a local SuperLink, about a minute on two cores: Ray starts first):
    >>> import tempfile
    >>> from icml26.common.tiny_lm import char_tokenizer, save_lab_model, tiny_causal_lm
    >>> from icml26.fedtreelora import FedTreeLoRA, LoRATrainer
    >>> from icml26.fedtreelora.data import World, make_clients
    >>> tok = char_tokenizer()
    >>> path = save_lab_model(tiny_causal_lm(len(tok), layers=2, hidden=16, heads=2, kv_heads=1), tok,
    ...                       tempfile.mkdtemp())
    >>> trainer = LoRATrainer.from_pretrained(path, r=2, alpha=4, batch_size=8)
    >>> clients = make_clients(World(per_rule=1), tok, n_train=16, n_val=8, n_test=8, seed=0)
    >>> algo = FedTreeLoRA(trainer, train_rounds=2, local_steps=2, lr=0.05, warmup_rounds=1)
    >>> outcome = run_local(algo, clients)                                     # doctest: +SKIP
    >>> outcome.result["log"]["cuts"], outcome.transcript.failures             # doctest: +SKIP
    ([1, 2], [{}, {}, {}])
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
from .baselines import (
    Ditto,
    FedAvgFT,
    FedAvgLoRA,
    FedSALoRA,
    FFALoRA,
    FixedDepthLoRA,
    FlatClusterLoRA,
    LocalLoRA,
    OracleClusterLoRA,
)
from .core import FederatedLoRA, FedTreeLoRA
from .data import ClientData, ClientSpec, World, make_clients

requires("flwr", extra="fedtreelora", purpose="the Flower App of fedtreelora")

APP_DIR = Path(__file__).with_name("flower_app")
"""The Flower App project (``flwr run`` takes this folder)."""
ARMS: dict[str, type[FederatedLoRA]] = {
    "fedtreelora": FedTreeLoRA, "local": LocalLoRA, "fedavg_lora": FedAvgLoRA, "fedavg_ft": FedAvgFT, "ditto": Ditto,
    "ffa_lora": FFALoRA,
    "fedsa_lora": FedSALoRA, "fixed_depth": FixedDepthLoRA, "flat_cluster": FlatClusterLoRA,
    "oracle_cluster": OracleClusterLoRA,
}
"""The ``arm`` names of the run config and their algorithms."""

_TRAINERS: dict[tuple, Any] = {}


# ------------------------------------------------------------------------------------------------ run config
def _json_list(run_config: Mapping[str, Any], key: str) -> list:
    value = str(run_config[key])
    try:
        out = json.loads(value)
    except json.JSONDecodeError:
        out = None
    if not isinstance(out, list) or not out:
        raise ValueError(f"{key} must be a non-empty JSON list, got {value[:80]!r}")
    return out


def trainer_from_run_config(run_config: Mapping[str, Any]) -> Any:
    """This process's ``LoRATrainer`` for the run config's base (``model-path``) and adapter settings (cached)."""
    from .client import LoRATrainer

    path = str(run_config["model-path"])
    targets = tuple(str(t) for t in _json_list(run_config, "target-modules"))
    labels = tuple(str(t) for t in _json_list(run_config, "labels"))
    kw = dict(labels=labels, target_modules=targets, r=int(run_config["rank"]), alpha=float(run_config["alpha"]),
              init_seed=int(run_config["init-seed"]), batch_size=int(run_config["batch-size"]))
    key = (path, *sorted((k, str(v)) for k, v in kw.items()))
    if key not in _TRAINERS:
        if path == DEMO:
            from .experiment import PRESETS, base_model

            model, tok = base_model(PRESETS["quick"])
            _TRAINERS[key] = LoRATrainer(model, tok, **kw)
        elif not path:
            raise ValueError("model-path is empty: set it to a directory with a saved causal LM and its tokenizer "
                             "(save_pretrained), or to 'demo'")
        else:
            _TRAINERS[key] = LoRATrainer.from_pretrained(path, **kw)
    return _TRAINERS[key]


def algorithm_from_run_config(run_config: Mapping[str, Any]) -> FederatedLoRA:
    """The algorithm (``arm``: FedTreeLoRA or a baseline) the run config describes; the inverse of ``run_config_of``."""
    arm = str(run_config["arm"])
    if arm not in ARMS:
        raise ValueError(f"arm must be one of {tuple(ARMS)}, got {arm!r}")
    trainer = trainer_from_run_config(run_config)
    gate_lr = float(run_config["gate-lr"])
    kw: dict[str, Any] = dict(train_rounds=int(run_config["train-rounds"]), local_steps=int(run_config["local-steps"]),
                              lr=float(run_config["lr"]), seed=int(run_config["seed"]))
    if arm == "fedtreelora":
        fixed_k = int(run_config["fixed-k"])
        return FedTreeLoRA(trainer, **kw, gate_lr=gate_lr if gate_lr > 0 else None,
                           gate_init=float(run_config["gate-init"]), warmup_rounds=int(run_config["warmup-rounds"]),
                           tau=float(run_config["tau"]), window=int(run_config["window"]),
                           distance=str(run_config["distance"]), linkage=str(run_config["linkage"]),
                           cut_rule=str(run_config["cut-rule"]), fixed_k=fixed_k if fixed_k > 0 else None,
                           external=bool(run_config["external"]))
    if arm == "fixed_depth":
        return FixedDepthLoRA(trainer, share_layers=int(run_config["share-layers"]), **kw)
    if arm == "fedavg_ft":
        return FedAvgFT(trainer, ft_rounds=int(run_config["ft-rounds"]), **kw)
    if arm == "ditto":
        return Ditto(trainer, lam=float(run_config["ditto-lam"]), **kw)
    if arm == "flat_cluster":
        return FlatClusterLoRA(trainer, warmup_rounds=int(run_config["warmup-rounds"]), tau=float(run_config["tau"]),
                               distance=str(run_config["distance"]), linkage=str(run_config["linkage"]), **kw)
    if arm == "oracle_cluster":
        labels = _json_list(run_config, "oracle-labels")
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in labels):
            raise ValueError(f"oracle-labels must be a JSON list of ints, got {labels!r}")
        return OracleClusterLoRA(trainer, labels=labels, **kw)
    return ARMS[arm](trainer, **kw)


def run_config_of(algorithm: FederatedLoRA, n_clients: int, policy: FailurePolicy | None = None, *,
                  model_path: str | None = None) -> dict[str, Any]:
    """The run config that makes the app run ``algorithm`` over ``n_clients`` clients with ``policy`` (default:
    every client needed). ``model_path``: the base's directory (default: ``algorithm.trainer.model_path``, set by
    ``LoRATrainer.from_pretrained``); the clients must load the base the algorithm's trainer wraps."""
    if not isinstance(algorithm, FederatedLoRA) or type(algorithm) not in ARMS.values():
        raise TypeError(f"algorithm must be one of {', '.join(c.__name__ for c in ARMS.values())}, "
                        f"got {type(algorithm).__name__}")
    t = algorithm.trainer
    path = model_path or getattr(t, "model_path", None)
    if not path:
        raise ValueError("model_path is needed: the directory of the saved base the clients load (build the trainer "
                         "with LoRATrainer.from_pretrained, or pass model_path, or 'demo')")
    a = algorithm
    config: dict[str, Any] = {
        "num-clients": int(n_clients), "arm": a.name, "model-path": str(path),
        "target-modules": json.dumps(list(t.target_modules)), "labels": json.dumps(list(t.labels)),
        "rank": int(t.r), "alpha": float(t.alpha), "init-seed": int(t.init_seed), "batch-size": int(t.batch_size),
        "train-rounds": int(a.train_rounds), "local-steps": int(a.local_steps), "lr": float(a.lr),
        "seed": int(a.seed), "gate-lr": float(a.gate_lr or 0.0), "gate-init": float(a.gate_init),
        **(policy or FailurePolicy()).to_run_config()}
    if isinstance(a, FedTreeLoRA):
        config.update({"warmup-rounds": int(a.warmup_rounds), "tau": float(a.tau), "window": int(a.window),
                       "distance": a.distance, "linkage": a.linkage, "cut-rule": a.cut_rule,
                       "fixed-k": int(a.fixed_k or 0), "external": bool(a.external)})
    elif isinstance(a, FlatClusterLoRA):
        config.update({"warmup-rounds": int(a.warmup_rounds), "tau": float(a.tau), "distance": a.distance,
                       "linkage": a.linkage})
    elif isinstance(a, FixedDepthLoRA):
        config["share-layers"] = len(a.shared_layers)
    elif isinstance(a, FedAvgFT):
        config["ft-rounds"] = int(a.ft_rounds)
    elif isinstance(a, Ditto):
        config["ditto-lam"] = float(a.lam)
    elif isinstance(a, OracleClusterLoRA):
        config["oracle-labels"] = json.dumps([int(v) for v in a.labels])
    return config


# ------------------------------------------------------------------------------------------------ client data
def write_client(path: str | Path, data: ClientData) -> Path:
    """Write one client's ``ClientData`` to an ``.npz`` its SuperNode can read (``data-path``)."""
    path = Path(path)
    s = data.spec
    np.savez(path, train_x=data.train[0], train_y=data.train[1], val_x=data.val[0], val_y=data.val[1],
             test_x=data.test[0], test_y=data.test[1], cid=np.int64(s.cid), rule=np.str_(s.rule),
             group=np.int64(s.group), subgroup=np.int64(s.subgroup))
    return path if path.suffix == ".npz" else path.with_name(path.name + ".npz")


def write_clients(clients: Sequence[ClientData], folder: str | Path) -> list[Path]:
    """``folder/client_<k>.npz`` for every client (``data-dir`` in the run config reads them)."""
    return federation.write_clients(clients, folder, write_client)


def read_client(path: str | Path, partition_id: int) -> ClientData:
    """A client's data from an ``.npz`` with ``train_x`` (n, T) token ids and integer ``train_y`` (n,); the
    validation / test splits (``val_*``, ``test_*``), ``cid`` (seed of its batch order; default: the partition
    id) and its planted rule are optional."""
    with np.load(path) as arrays:
        if "train_x" not in arrays or "train_y" not in arrays:
            raise ValueError(f"{path}: needs the arrays train_x and train_y, has {sorted(arrays.files)}")
        got = {k: arrays[k] for k in arrays.files}
    splits = []
    for split in ("train", "val", "test"):
        x = got.get(f"{split}_x", np.zeros((0, got["train_x"].shape[-1]), dtype=np.int64))
        y = got.get(f"{split}_y", np.zeros(0, dtype=np.int64))
        if x.ndim != 2 or y.ndim != 1 or len(x) != len(y):
            raise ValueError(f"{path}: {split}_x must be (n, T) and {split}_y (n,), got {x.shape} and {y.shape}")
        if not (np.issubdtype(x.dtype, np.integer) and np.issubdtype(y.dtype, np.integer)):
            raise ValueError(f"{path}: {split}_x must hold token ids and {split}_y class labels (integers), got "
                             f"{x.dtype} and {y.dtype}")
        if len(x) and (x.min() < 0 or y.min() < 0):
            raise ValueError(f"{path}: {split} holds negative token ids or labels")
        splits.append((x.astype(np.int64), y.astype(np.int64)))
    spec = ClientSpec(int(got.get("cid", partition_id)), str(got.get("rule", "")), int(got.get("group", -1)),
                      int(got.get("subgroup", -1)))
    return ClientData(spec, *splits)


def load_client(partition_id: int, node_config: Mapping[str, Any], run_config: Mapping[str, Any]) -> ClientData:
    """This client's data: its node's ``data-path``, else ``data-dir/client_<id>.npz``, else the demo world."""
    path = client_data_path(partition_id, node_config, run_config)
    if path:
        return read_client(path, partition_id)
    world = World()
    demo_clients(partition_id, node_config, run_config, world.n_clients, world="demo world")
    logging.getLogger("flwr").info("client %d: the demo data (the planted rule world)", partition_id)
    tok = trainer_from_run_config(run_config).tokenizer
    clients = make_clients(world, tok, n_train=int(run_config["demo-train"]), n_val=int(run_config["demo-val"]),
                           n_test=int(run_config["demo-test"]), seed=int(run_config["data-seed"]))
    return clients[partition_id]


def summary(result: Mapping[str, Any]) -> str:
    """One log line for the result (the final server state)."""
    cuts = (result.get("log") or {}).get("cuts")
    acc = [float(np.mean(v)) for v in result.get("test", {}).values() if len(v)]
    line = f"{len(result.get('bytes_up', []))} training round(s) aggregated"
    if cuts:
        line += f"; clusters per layer {list(map(int, cuts))}"
    if acc:
        line += f"; mean test accuracy {np.mean(acc):.4f}, worst client {min(acc):.4f}"
    return "FedTreeLoRA app: " + line


server_app = flower_server_app(algorithm_from_run_config, summary=summary)
"""The ``ServerApp`` (``[tool.flwr.app.components] serverapp``)."""
client_app = flower_client_app(algorithm_from_run_config, load_client)
"""The ``ClientApp`` (``[tool.flwr.app.components] clientapp``)."""


def run_local(algorithm: FederatedLoRA, clients: Sequence[ClientData], *, model_path: str | None = None,
              policy: FailurePolicy | None = None, engine: str = "simulation", timeout: float = 900.0,
              connect_timeout: float = 600.0, num_cpus: int = 2, home: str | Path | None = None,
              app_dir: str | Path = APP_DIR) -> FlowerOutcome:
    """Run ``algorithm`` over ``clients`` with the Flower App on a local SuperLink, through ``flwr run``.

    Args:
        model_path: the base's directory (default: ``algorithm.trainer.model_path``).
        policy: the failure policy (default: every client must answer).
        engine: ``"simulation"`` (Flower's simulation engine, Ray) or ``"deployment"`` (one SuperNode process
            per client, each given only its own data file through ``--node-config``).
        timeout: seconds for the whole run.
        connect_timeout: seconds the server waits for the SuperNodes and for each to say which client it is
            (Ray's actors start and import the client's code first: minutes on a loaded machine).
        home: Flower's home directory (its logs); default: a temporary one.

    Returns:
        ``FlowerOutcome``: ``result`` (the final server state, as ``run_in_process``: ``val`` / ``test`` per client,
        ``log`` with the tree and cuts, ``messages``, byte counts), the ``transcript`` and Flower's run id.
    """
    config = {**run_config_of(algorithm, len(clients), policy, model_path=model_path),
              "connect-timeout": float(connect_timeout)}
    return run_flower_app(app_dir, config, clients, write_client, engine=engine, timeout=timeout, num_cpus=num_cpus,
                          home=home, prefix="icml26-fedtreelora-")
