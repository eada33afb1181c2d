"""AIR's policy layer, tool manifests from files: what ``icml26 air proxy --manifest FILE`` reads.

A manifest file (TOML, or JSON with the same structure) declares each tool as a
:class:`~icml26.air.policy.manifest.ToolSpec` (effect classes, the arguments naming outside parties and the content
that leaves, the state paths the tool writes, its inverse operation) and, optionally, the ``known`` state paths
whose values are parties the user already deals with::

    known = ["contacts.[*]"]                    # optional
    state = ["files", "shared", "contacts"]     # optional: the state's top-level keys

    [tools.share]
    effects = ["changes_permissions", "sends_out"]
    args = ["path", "email"]                    # optional: the tool's parameters
    targets = ["email"]                         # optional; so are content, resources and inverse
    resources = ["shared.{path}"]
    inverse = { tool = "unshare", args = { path = "arg:path", email = "arg:email" } }

The effect classes, the argument bindings of an inverse and what declaring ``args`` and ``state`` does (rules naming
an undeclared argument or state key are refused) are those of :mod:`icml26.air.policy.manifest`. An
unknown key, effect class or binding is an error naming the tool (a misspelt declaration would silently weaken the
generic rules). ``integrations/demo_manifest.toml`` declares the demo server's tools.

Example:
    >>> m = manifest_from_mapping({"tools": {"rm": {"effects": ["destroys"], "inverse": {"tool": "restore",
    ...                                                 "args": {"path": "arg:path"}}}}})
    >>> sorted(m.effects("rm")), sorted(m.recovery_tools())
    (['destroys'], ['restore'])
"""

from __future__ import annotations

import json
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .manifest import Inverse, Manifest, ToolSpec

_TOOL_KEYS = {"effects", "args", "targets", "content", "resources", "inverse"}
_BINDINGS = ("arg:", "args:", "lit:", "pre:", "created:")


def _strings(tool: str, key: str, v: Any) -> tuple[str, ...]:
    if isinstance(v, str):
        v = v.split()
    if not isinstance(v, list | tuple) or not all(isinstance(s, str) for s in v):
        raise ValueError(f"tool {tool!r}: {key} must be a list of strings")
    return tuple(v)


def manifest_from_mapping(data: Mapping[str, Any]) -> Manifest:
    """A :class:`~icml26.air.policy.manifest.Manifest` from a parsed manifest file (see the module docstring)."""
    if not isinstance(data, Mapping):
        raise ValueError("a manifest is a table with a [tools] table")
    extra = sorted(set(data) - {"tools", "known", "state"})
    if extra:
        raise ValueError(f"unknown manifest key(s) {extra} (known: tools, known, state)")
    tools = data.get("tools")
    if not isinstance(tools, Mapping) or not tools:
        raise ValueError("a manifest needs a non-empty [tools] table")
    specs = {}
    for name, t in tools.items():
        if not isinstance(t, Mapping):
            raise ValueError(f"tool {name!r}: its declaration must be a table")
        bad = sorted(set(t) - _TOOL_KEYS)
        if bad:
            raise ValueError(f"tool {name!r}: unknown key(s) {bad} (known: {', '.join(sorted(_TOOL_KEYS))})")
        if "effects" not in t:
            raise ValueError(f"tool {name!r}: effects is required")
        inverse = None
        if t.get("inverse") is not None:
            inv = t["inverse"]
            if not isinstance(inv, Mapping) or not isinstance(inv.get("tool"), str) or set(inv) - {"tool", "args"}:
                raise ValueError(f"tool {name!r}: inverse must be {{ tool = NAME, args = {{ ARG = BINDING }} }}")
            args = inv.get("args") or {}
            if not isinstance(args, Mapping) or not all(
                    isinstance(b, str) and b.startswith(_BINDINGS) for b in args.values()):
                raise ValueError(f"tool {name!r}: inverse args must be bindings ({', '.join(_BINDINGS)})")
            inverse = Inverse(inv["tool"], dict(args))
        optional = {"args": _strings(name, "args", t["args"])} if "args" in t else {}
        try:
            specs[str(name)] = ToolSpec(_strings(name, "effects", t["effects"]), **optional,
                                        targets=_strings(name, "targets", t.get("targets", ())),
                                        content=_strings(name, "content", t.get("content", ())),
                                        resources=_strings(name, "resources", t.get("resources", ())),
                                        inverse=inverse)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"tool {name!r}: {exc}") from None
    state = {"state": _strings("(manifest)", "state", data["state"])} if "state" in data else {}
    return Manifest(specs, known=_strings("(manifest)", "known", data.get("known", ())), **state)


def load_manifest(path: str | Path) -> Manifest:
    """Read a manifest file: TOML, or JSON when the name ends in ``.json``; errors name the file."""
    path = Path(path)
    text = path.read_text(encoding="utf-8")
    try:
        data = json.loads(text) if path.suffix.lower() == ".json" else tomllib.loads(text)
        return manifest_from_mapping(data)
    except (ValueError, tomllib.TOMLDecodeError) as exc:
        raise ValueError(f"{path}: {exc}") from None
