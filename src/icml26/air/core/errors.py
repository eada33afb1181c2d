"""AIR's core layer, errors: a check that cannot be decided, and a rule file that does not parse or validate."""

from __future__ import annotations


class CheckError(RuntimeError):
    """A check that cannot be decided (no semantic backend, an LLM that fails or answers neither yes nor no)."""


class RuleSyntaxError(ValueError):
    """A rule file that does not parse or does not validate: ``file:line:column: message``."""

    def __init__(self, message: str, *, file: str = "<rules>", line: int = 0, column: int = 0):
        self.file, self.line, self.column, self.detail = file, line, column, message
        super().__init__(f"{file}:{line}:{column}: {message}")
