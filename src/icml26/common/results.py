"""The one result format: per-seed runs aggregated to mean ± std, claims decided by code, JSON written atomically.

``results/<slug>/<mode>.json`` holds::

    {"slug", "mode", "seeds", "config",
     "arms":   {ARM: {METRIC: {"mean", "std", "values": [...]}}},
     "claims": [{"id", "text", "check", "paper", "ours", "holds", "why"}],
     "env":    {python, torch, numpy, packages, git_sha, cpu, threads, ...},
     "wall_s", "created"}

Only ``icml26 reproduce`` writes these files. ``std`` is the sample standard deviation (ddof = 1; 0 for one
seed).

Example:
    >>> summarize([1.0, 2.0, 3.0])
    {'mean': 2.0, 'std': 1.0, 'values': [1.0, 2.0, 3.0]}
    >>> runs = [SeedRun({"a": {"acc": 0.5}}), SeedRun({"a": {"acc": 0.7}})]
    >>> aggregate_arms(runs)["a"]["acc"]["mean"]
    0.6
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .claims import is_number_list
from .io import atomic_write_text

SCHEMA_KEYS = ("slug", "mode", "seeds", "config", "arms", "claims", "env", "wall_s", "created")
CLAIM_KEYS = ("id", "text", "check", "paper", "ours", "holds", "why")
MODES = ("smoke", "quick", "full")


class ResultSchemaError(ValueError):
    """A result JSON does not follow the schema in this module's docstring."""


@dataclass
class SeedRun:
    """What an experiment's ``run(cfg)`` returns for one seed.

    Attributes:
        metrics: ``{arm: {metric: float}}``; every arm the card's checks name must be present.
        series: curves or other per-seed data for plots (not written to the JSON).
        notes: ``{claim_id: text}``: the experiment's own remark on a claim (e.g. why it cannot hold at this
            scale); appended to the claim's ``why``.
    """

    metrics: dict[str, dict[str, float]]
    series: dict[str, Any] = field(default_factory=dict)
    notes: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.metrics, Mapping) or not self.metrics:
            raise TypeError("metrics must be a non-empty dict {arm: {metric: float}}")
        for arm, metrics in self.metrics.items():
            if not isinstance(arm, str) or not isinstance(metrics, Mapping):
                raise TypeError(f"metrics[{arm!r}] must map metric names to floats")
            for name, value in metrics.items():
                if isinstance(value, bool) or not isinstance(value, (int, float)):
                    raise TypeError(f"metrics[{arm!r}][{name!r}] must be a real number, got {value!r}")


def summarize(values: Sequence[float]) -> dict[str, Any]:
    """``{"mean", "std", "values"}`` of ``values`` (sample std, ddof = 1; 0 for one value; NaN propagates)."""
    vals = [float(v) for v in values]
    if not vals:
        raise ValueError("values must be non-empty")
    n = len(vals)
    if all(v == vals[0] for v in vals):  # exact, without round-off (NaN never equals itself)
        return {"mean": vals[0], "std": 0.0, "values": vals}
    mean = math.fsum(vals) / n
    std = math.sqrt(math.fsum((v - mean) ** 2 for v in vals) / (n - 1)) if n > 1 else 0.0
    return {"mean": mean, "std": std, "values": vals}


def aggregate_arms(runs: Sequence[SeedRun]) -> dict[str, dict[str, dict[str, Any]]]:
    """Stack per-seed metrics into ``{arm: {metric: summarize(values)}}``.

    Raises:
        ValueError: seeds disagree on which arms/metrics they measured.
    """
    if not runs:
        raise ValueError("runs must be non-empty")
    keys = {(a, m) for a, ms in runs[0].metrics.items() for m in ms}
    for i, run in enumerate(runs[1:], start=1):
        other = {(a, m) for a, ms in run.metrics.items() for m in ms}
        if other != keys:
            raise ValueError(f"seed run {i} measured different arm/metric pairs: {sorted(other ^ keys)}")
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for arm in runs[0].metrics:
        out[arm] = {m: summarize([r.metrics[arm][m] for r in runs]) for m in runs[0].metrics[arm]}
    return out


def validate_result(data: Mapping[str, Any]) -> None:
    """Raise ``ResultSchemaError`` unless ``data`` follows the result schema."""
    if not isinstance(data, Mapping):
        raise ResultSchemaError("result must be a JSON object")
    missing = [k for k in SCHEMA_KEYS if k not in data]
    if missing:
        raise ResultSchemaError(f"result is missing keys {missing}")
    if data["mode"] not in MODES:
        raise ResultSchemaError(f"mode must be one of {MODES}, got {data['mode']!r}")
    seeds = data["seeds"]
    if not isinstance(seeds, list) or not seeds or not all(isinstance(s, int) for s in seeds):
        raise ResultSchemaError("seeds must be a non-empty list of ints")
    arms = data["arms"]
    if not isinstance(arms, Mapping) or not arms:
        raise ResultSchemaError("arms must be a non-empty object")
    for arm, metrics in arms.items():
        if not isinstance(metrics, Mapping) or not metrics:
            raise ResultSchemaError(f"arms[{arm!r}] must be a non-empty object")
        for name, stat in metrics.items():
            if not isinstance(stat, Mapping) or set(stat) != {"mean", "std", "values"}:
                raise ResultSchemaError(f"arms[{arm!r}][{name!r}] must have exactly mean, std, values")
            if not isinstance(stat["values"], list) or len(stat["values"]) != len(seeds):
                raise ResultSchemaError(f"arms[{arm!r}][{name!r}].values must have one value per seed")
            if not is_number_list([stat["mean"], stat["std"], *stat["values"]]):
                raise ResultSchemaError(f"arms[{arm!r}][{name!r}] must hold numbers")
    claims = data["claims"]
    if not isinstance(claims, list):
        raise ResultSchemaError("claims must be a list")
    for claim in claims:
        if not isinstance(claim, Mapping) or any(k not in claim for k in CLAIM_KEYS):
            raise ResultSchemaError(f"every claim needs keys {CLAIM_KEYS}, got {claim!r}")
        if not isinstance(claim["holds"], bool):
            raise ResultSchemaError(f"claim {claim['id']!r}: holds must be true or false")
    if not isinstance(data["wall_s"], (int, float)) or data["wall_s"] < 0:
        raise ResultSchemaError("wall_s must be a non-negative number")
    if not isinstance(data["env"], Mapping):
        raise ResultSchemaError("env must be an object")


def _json_default(obj: Any) -> Any:
    if isinstance(obj, Path):
        return str(obj)
    if hasattr(obj, "item"):  # numpy / torch scalars
        return obj.item()
    if hasattr(obj, "tolist"):
        return obj.tolist()
    raise TypeError(f"object of type {type(obj).__name__} is not JSON serializable")


def dumps_result(data: Mapping[str, Any]) -> str:
    """Serialise a result deterministically (sorted keys, 2-space indent, NaN written as ``NaN``)."""
    return json.dumps(data, indent=2, sort_keys=True, default=_json_default, allow_nan=True) + "\n"


def write_result(path: str | os.PathLike[str], data: Mapping[str, Any]) -> Path:
    """Validate ``data`` and write it to ``path`` atomically (temp file + rename). Returns the path."""
    validate_result(data)
    text = dumps_result(data)
    atomic_write_text(path, text)
    return Path(path)


def read_result(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read and validate a result JSON."""
    p = Path(path)
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ResultSchemaError(f"{p}: not valid JSON ({exc})") from exc
    try:
        validate_result(data)
    except ResultSchemaError as exc:
        raise ResultSchemaError(f"{p}: {exc}") from exc
    return data
