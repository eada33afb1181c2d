"""The one result format: per-seed runs aggregated to mean ± std, claims decided by code, JSON written atomically.

``results/<slug>/<mode>.json`` holds::

    {"slug", "mode", "seeds", "config",
     "arms":   {ARM: {METRIC: {"mean", "std", "values": [one per seed],
                               ["unit": "prompts", "unit_values": [[one per unit] per seed]]}}},
     "claims": [{"id", "text", "check", "kind", "min_effect_why", "paper", "ours",
                 "verdict", "holds", "estimate", "interval", "test", "units", "per_seed", "why", "notes"}],
     "provenance": {"card_sha256", "sources": {path: sha256}},
     "env":    {python, torch, numpy, packages, git_sha, git_dirty, cpu, threads, ...},
     "complete", "wall_s", "created",
     # the verdict rules that decided the claims (common/claims.py RULES; 3 or 4):
     "rules": 4,
     "unit_ids": {UNIT: [[id per unit] per seed]},            # what each unit is (prompt hash, episode, ...)
     "overlap":  {UNIT: {"train": [n per seed], "validation": [n per seed]}},   # test ids also used there
     "headline": {"id", "verdict", "decidable", "preconditions": {id: verdict}},
     "gated": {claim id: {"decidable", "preconditions": {id: verdict}}}}  # only with scoped preconditions

A v3 claim entry also holds ``direction``, ``headline`` and ``design`` (distinct runs and units, the design
effect). Non-finite numbers are written as ``null`` (strict JSON) and read back as NaN.

Only ``icml26 reproduce`` writes these files. ``std`` is the sample standard deviation (ddof = 1; 0 for one
seed). A metric with per-unit values (``SeedRun.units``) has, on each seed, the mean of its units as value.
``holds`` is ``verdict == "holds"``, kept for readers of the older format.

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
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .claims import CLAIM_KINDS, SUPPORTED_RULES, VERDICTS, is_number_list
from .io import atomic_write_text

SCHEMA_KEYS = ("slug", "mode", "seeds", "config", "arms", "claims", "provenance", "env", "complete", "wall_s",
               "created")
CLAIM_KEYS = ("id", "text", "check", "kind", "min_effect_why", "paper", "ours", "verdict", "holds", "estimate",
              "interval", "test", "units", "per_seed", "why", "notes")
#: what a verdicts-v3 claim entry holds besides ``CLAIM_KEYS``
CLAIM_KEYS_V3 = ("direction", "headline", "design")
#: the splits a test unit must not also belong to
HELD_OUT_SPLITS = ("train", "validation")
#: agreement asked between a seed's metric value and the mean of its per-unit values
UNIT_MEAN_RTOL = 1e-9
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
            scale); stored in the claim's ``notes``.
        units: ``{unit: {arm: {metric: [one value per unit]}}}``: per-unit outcomes (``"prompts"``,
            ``"episodes"``, ``"replications"``), paired by index across arms, that a check ``over UNIT``
            decides. The metric's per-seed value is the mean of its units; it may be left out of ``metrics``
            and is filled in.
        unit_ids: ``{unit: [one id per unit]}``: what each unit is (a prompt's text hash, an episode seed, an
            incident id, a test item's index in a fixed pool), so that a unit is counted once (``claims``).
        held_out: ``{unit: {"train": ids, "validation": ids}}``: the ids of that kind of unit the run trained
            or tuned on; a test unit among them makes the reproduction refuse the result.
    """

    metrics: dict[str, dict[str, float]]
    series: dict[str, Any] = field(default_factory=dict)
    notes: dict[str, str] = field(default_factory=dict)
    units: dict[str, dict[str, dict[str, Sequence[float]]]] = field(default_factory=dict)
    unit_ids: dict[str, Sequence[Any]] = field(default_factory=dict)
    held_out: dict[str, dict[str, Sequence[Any]]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.metrics, Mapping) or (not self.metrics and not self.units):
            raise TypeError("metrics must be a non-empty dict {arm: {metric: float}}")
        for arm, metrics in self.metrics.items():
            if not isinstance(arm, str) or not isinstance(metrics, Mapping):
                raise TypeError(f"metrics[{arm!r}] must map metric names to floats")
            for name, value in metrics.items():
                if isinstance(value, bool) or not isinstance(value, (int, float)):
                    raise TypeError(f"metrics[{arm!r}][{name!r}] must be a real number, got {value!r}")
        if not isinstance(self.units, Mapping):
            raise TypeError("units must be a dict {unit: {arm: {metric: [values]}}}")
        self.metrics = {arm: dict(ms) for arm, ms in self.metrics.items()}
        seen: dict[tuple[str, str], str] = {}
        for unit, by_arm in self.units.items():
            if not isinstance(unit, str) or not unit.isidentifier() or unit == "seeds":
                raise ValueError(f"unit names must be identifiers other than 'seeds', got {unit!r}")
            for arm, metrics in by_arm.items():
                for name, values in metrics.items():
                    if (arm, name) in seen:
                        raise ValueError(f"{arm}.{name} has units {seen[arm, name]!r} and {unit!r}")
                    seen[arm, name] = unit
                    vals = [float(v) for v in values]
                    if not vals or not is_number_list(list(values)):
                        raise TypeError(f"units[{unit!r}][{arm!r}][{name!r}] must be a non-empty list of numbers")
                    mean = math.fsum(vals) / len(vals)
                    given = self.metrics.get(arm, {}).get(name)
                    if given is not None and not _close(float(given), mean):
                        raise ValueError(f"metrics[{arm!r}][{name!r}] = {given} is not the mean of its "
                                         f"{unit} ({mean})")
                    self.metrics.setdefault(arm, {})[name] = mean
        self._check_ids(seen)

    def _check_ids(self, seen: Mapping[tuple[str, str], str]) -> None:
        if not isinstance(self.unit_ids, Mapping) or not isinstance(self.held_out, Mapping):
            raise TypeError("unit_ids must be {unit: [ids]} and held_out {unit: {split: [ids]}}")
        for key, ids in self.unit_ids.items():
            if isinstance(ids, (str, bytes)) or not isinstance(ids, Sequence):
                raise TypeError(f"unit_ids[{key!r}] must be a list of ids")
            self.unit_ids[key] = [str(u) for u in ids]
            if "." in key:  # ids of one metric: "arm.metric"
                arm, _, name = key.partition(".")
                if (arm, name) not in seen:
                    raise ValueError(f"unit_ids names {key!r}, which has no per-unit values")
                covered = [(arm, name)]
            elif key in self.units:
                covered = [am for am, u in seen.items() if u == key and f"{am[0]}.{am[1]}" not in self.unit_ids]
            else:
                raise ValueError(f"unit_ids names {key!r}, which has no per-unit values (units: {sorted(self.units)})")
            for arm, name in covered:
                n = len(self.units[seen[arm, name]][arm][name])
                if n != len(ids):
                    raise ValueError(f"unit_ids[{key!r}] has {len(ids)} ids but {arm}.{name} has {n} units")
        for unit, splits in self.held_out.items():
            if unit not in self.unit_ids:
                raise ValueError(f"held_out names {unit!r}, which has no unit_ids (held_out is keyed like unit_ids)")
            if not isinstance(splits, Mapping) or set(splits) - set(HELD_OUT_SPLITS):
                raise ValueError(f"held_out[{unit!r}] must map {HELD_OUT_SPLITS} to ids")

    def overlap(self) -> dict[str, dict[str, int]]:
        """``{unit: {split: how many distinct test ids are also in that split}}``."""
        out: dict[str, dict[str, int]] = {}
        for unit, splits in self.held_out.items():
            test = set(self.unit_ids[unit])
            out[unit] = {split: len(test & {str(u) for u in splits.get(split, ())}) for split in HELD_OUT_SPLITS}
        return out

    def unit_of(self, arm: str, metric: str) -> str | None:
        """The unit name of ``arm.metric``'s per-unit values, or ``None``."""
        return next((u for u, by_arm in self.units.items() if metric in by_arm.get(arm, {})), None)


def _cell(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def markdown_table(headers: Iterable[str], rows: Iterable[Iterable[Any]]) -> str:
    """A GitHub Markdown table (``|`` in a cell escaped, newlines folded).

    Example:
        >>> print(markdown_table(["a", "b"], [[1, "x|y"]]))
        | a | b |
        |---|---|
        | 1 | x\\|y |
    """
    headers = list(headers)
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _close(a: float, b: float) -> bool:
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return abs(a - b) <= UNIT_MEAN_RTOL * max(1.0, abs(a), abs(b))


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
        out[arm] = {}
        for m in runs[0].metrics[arm]:
            stat = summarize([r.metrics[arm][m] for r in runs])
            unit = runs[0].unit_of(arm, m)
            if any(r.unit_of(arm, m) != unit for r in runs):
                raise ValueError(f"seeds disagree on the per-unit values of {arm}.{m}")
            if unit is not None:
                stat["unit"] = unit
                stat["unit_values"] = [[float(v) for v in r.units[unit][arm][m]] for r in runs]
            out[arm][m] = stat
    return out


def aggregate_ids(runs: Sequence[SeedRun]) -> tuple[dict[str, list[list[str]]], dict[str, dict[str, list[int]]]]:
    """``(unit_ids, overlap)`` of a result: per unit, the ids and the held-out overlap counts of every seed.

    Raises:
        ValueError: seeds disagree on which units carry ids or held-out sets.
    """
    names = set(runs[0].unit_ids)
    splits = set(runs[0].held_out)
    if any(set(r.unit_ids) != names or set(r.held_out) != splits for r in runs):
        raise ValueError("seeds disagree on which units carry ids or held-out sets")
    ids = {u: [list(r.unit_ids[u]) for r in runs] for u in sorted(names)}
    overlap = {u: {s: [r.overlap()[u][s] for r in runs] for s in HELD_OUT_SPLITS} for u in sorted(splits)}
    return ids, overlap


def validate_result(data: Mapping[str, Any]) -> None:
    """Raise ``ResultSchemaError`` unless ``data`` follows the result schema (``null`` counts as NaN in the
    numeric fields, as strict JSON writes it)."""
    if not isinstance(data, Mapping):
        raise ResultSchemaError("result must be a JSON object")
    _validate_converted(_null_to_nan(data))


def _validate_converted(data: Mapping[str, Any]) -> None:
    """``validate_result`` of data whose numeric nulls are already NaN (``read_result`` converts while parsing)."""
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
            keys = set(stat) if isinstance(stat, Mapping) else set()
            if keys not in ({"mean", "std", "values"}, {"mean", "std", "values", "unit", "unit_values"}):
                raise ResultSchemaError(f"arms[{arm!r}][{name!r}] must have mean, std, values "
                                        "(and unit, unit_values together)")
            if not isinstance(stat["values"], list) or len(stat["values"]) != len(seeds):
                raise ResultSchemaError(f"arms[{arm!r}][{name!r}].values must have one value per seed")
            if not is_number_list([stat["mean"], stat["std"], *stat["values"]]):
                raise ResultSchemaError(f"arms[{arm!r}][{name!r}] must hold numbers")
            if "unit" in stat:
                uv = stat["unit_values"]
                if (not isinstance(stat["unit"], str) or not isinstance(uv, list) or len(uv) != len(seeds)
                        or not all(isinstance(s, list) and s and is_number_list(s) for s in uv)):
                    raise ResultSchemaError(f"arms[{arm!r}][{name!r}].unit_values must be one non-empty list "
                                            "of numbers per seed")
    claims = data["claims"]
    if not isinstance(claims, list):
        raise ResultSchemaError("claims must be a list")
    for claim in claims:
        if not isinstance(claim, Mapping) or any(k not in claim for k in CLAIM_KEYS):
            missing_keys = [k for k in CLAIM_KEYS if not isinstance(claim, Mapping) or k not in claim]
            raise ResultSchemaError(f"claim {claim.get('id') if isinstance(claim, Mapping) else claim!r} "
                                    f"is missing keys {missing_keys}")
        if claim["verdict"] not in VERDICTS:
            raise ResultSchemaError(f"claim {claim['id']!r}: verdict must be one of {VERDICTS}")
        if claim["holds"] is not (claim["verdict"] == "holds"):
            raise ResultSchemaError(f"claim {claim['id']!r}: holds must equal (verdict == 'holds')")
        if claim["kind"] not in CLAIM_KINDS:
            raise ResultSchemaError(f"claim {claim['id']!r}: kind must be one of {CLAIM_KINDS}")
        if not (isinstance(claim["interval"], list) and len(claim["interval"]) == 2
                and is_number_list([claim["estimate"], *claim["interval"]])):
            raise ResultSchemaError(f"claim {claim['id']!r}: estimate and interval [lo, hi] must be numbers")
    prov = data["provenance"]
    if not (isinstance(prov, Mapping) and isinstance(prov.get("card_sha256"), str)
            and isinstance(prov.get("sources"), Mapping)):
        raise ResultSchemaError("provenance must hold card_sha256 and sources {path: sha256}")
    if not isinstance(data["complete"], bool):
        raise ResultSchemaError("complete must be true or false")
    if not isinstance(data["wall_s"], (int, float)) or data["wall_s"] < 0:
        raise ResultSchemaError("wall_s must be a non-negative number")
    if not isinstance(data["env"], Mapping):
        raise ResultSchemaError("env must be an object")
    rules = data.get("rules")
    if rules not in SUPPORTED_RULES:
        raise ResultSchemaError(f"rules must be one of {SUPPORTED_RULES} (a result written before verdicts v3 "
                                f"must be regenerated), got {rules!r}")
    _validate_v3(data)


def _validate_v3(data: Mapping[str, Any]) -> None:
    for claim in data["claims"]:
        missing = [k for k in CLAIM_KEYS_V3 if k not in claim]
        if missing:
            raise ResultSchemaError(f"claim {claim['id']!r} is missing keys {missing} (verdicts v3)")
    n = len(data["seeds"])
    for unit, per_seed in data.get("unit_ids", {}).items():
        if not isinstance(per_seed, list) or len(per_seed) != n or not all(
                isinstance(s, list) and all(isinstance(u, str) for u in s) for s in per_seed):
            raise ResultSchemaError(f"unit_ids[{unit!r}] must be one list of string ids per seed")
    for unit, splits in data.get("overlap", {}).items():
        if not isinstance(splits, Mapping) or set(splits) != set(HELD_OUT_SPLITS) or not all(
                isinstance(v, list) and len(v) == n and all(isinstance(x, int) for x in v) for v in splits.values()):
            raise ResultSchemaError(f"overlap[{unit!r}] must give {HELD_OUT_SPLITS} counts per seed")
    head = data.get("headline")
    if head is not None and not (isinstance(head, Mapping) and {"id", "verdict", "decidable", "preconditions"}
                                 <= set(head)):
        raise ResultSchemaError("headline must hold id, verdict, decidable and preconditions")
    gated = data.get("gated", {})
    if not isinstance(gated, Mapping) or not all(
            isinstance(g, Mapping) and {"decidable", "preconditions"} <= set(g) for g in gated.values()):
        raise ResultSchemaError("gated must map claim ids to {decidable, preconditions}")


def _json_default(obj: Any) -> Any:
    if isinstance(obj, Path):
        return str(obj)
    if hasattr(obj, "item"):  # numpy / torch scalars
        return obj.item()
    if hasattr(obj, "tolist"):
        return obj.tolist()
    raise TypeError(f"object of type {type(obj).__name__} is not JSON serializable")


def dumps_result(data: Mapping[str, Any]) -> str:
    """Serialise a result deterministically (sorted keys, 2-space indent; strict JSON: NaN written as ``null``).

    Per-unit value lists are written one seed per line, whole numbers without ``.0``, so a result with
    thousands of units stays readable and small.
    """
    compact: dict[str, str] = {}

    def shrink(obj: Any) -> Any:
        if isinstance(obj, Mapping):
            out = {}
            for k, v in obj.items():
                if k == "unit_values" and isinstance(v, list):
                    key = f"@@unit_values_{len(compact)}@@"
                    # whole numbers (0/1 outcomes, counts) written without ".0": half the size of a 0/1 file
                    ints = [[int(x) if isinstance(x, float) and x.is_integer() and abs(x) < 2**53 else x
                             for x in seed] for seed in v]
                    compact[key] = json.dumps(_finite_or_null(ints), default=_json_default, allow_nan=False,
                                              separators=(",", ":"))
                    out[k] = key
                else:
                    out[k] = shrink(v)
            return out
        if isinstance(obj, (list, tuple)):
            return [shrink(v) for v in obj]
        return obj

    text = json.dumps(shrink(_finite_or_null(data)), indent=2, sort_keys=True, default=_json_default,
                      allow_nan=False) + "\n"
    for key, value in compact.items():
        text = text.replace(f'"{key}"', value.replace("],[", "],\n        ["), 1)
    return text


#: the numeric fields whose ``null`` (a non-finite number in strict JSON) reads back as NaN
_NUMERIC_KEYS = frozenset({"mean", "std", "values", "unit_values", "estimate", "interval", "per_seed"})


def _finite_or_null(obj: Any) -> Any:
    """``obj`` with every NaN or infinite float replaced by ``None`` (strict JSON has no NaN)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, Mapping):
        return {k: _finite_or_null(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite_or_null(v) for v in obj]
    if getattr(obj, "shape", None) == () and hasattr(obj, "item"):  # numpy / torch scalars
        return _finite_or_null(obj.item())
    return obj


def _null_to_nan(obj: Any, numeric: bool = False) -> Any:
    if obj is None and numeric:
        return math.nan
    if isinstance(obj, Mapping):
        return {k: _null_to_nan(v, k in _NUMERIC_KEYS) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_null_to_nan(v, numeric) for v in obj]
    return obj


def _nan_hook(obj: dict[str, Any]) -> dict[str, Any]:
    """``json.loads`` object hook: ``_null_to_nan`` in the same pass as the parse (each object's numeric fields;
    its nested objects were converted by their own call)."""
    for k in _NUMERIC_KEYS & obj.keys():
        obj[k] = _null_to_nan(obj[k], True)
    return obj


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
        data = json.loads(p.read_text(encoding="utf-8"), object_hook=_nan_hook)
    except json.JSONDecodeError as exc:
        raise ResultSchemaError(f"{p}: not valid JSON ({exc})") from exc
    if not isinstance(data, dict):
        raise ResultSchemaError(f"{p}: result must be a JSON object")
    try:
        _validate_converted(data)
    except ResultSchemaError as exc:
        raise ResultSchemaError(f"{p}: {exc}") from exc
    return data
