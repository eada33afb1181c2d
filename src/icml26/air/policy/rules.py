"""AIR's policy layer, the rule files shipped in ``air/rules/`` (detection, prevention, generic)."""

from __future__ import annotations

from importlib.resources import files

from ..dsl import RuleSet, parse

#: the package whose ``rules`` folder holds the rule files (``icml26.air``)
_PACKAGE = __package__.rpartition(".")[0]


def builtin_rules(name: str) -> RuleSet:
    """A rule file shipped with the package: ``shell``, ``email``, ``household`` (detection and response) or
    ``prevent_shell``, ``prevent_email``, ``prevent_household`` (developer prevention rules)."""
    path = files(_PACKAGE) / "rules" / f"{name}.air"
    if not path.is_file():
        raise ValueError(f"no built-in rule file {name!r}")
    return parse(path.read_text(), file=f"rules/{name}.air")
