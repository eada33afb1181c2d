"""AIR's core layer, regular expressions: RE2 (linear time) for rules and the taint and entity scans."""

from __future__ import annotations

import functools
import sys
from collections.abc import Iterator
from typing import Any

MAX_REGEX_CHARS = 2_000         # a ``matches`` pattern longer than this is refused


def compile_regex(pattern: str) -> Any:
    """Compile ``pattern`` with RE2, a linear-time engine: no backtracking, so no rule can hang a hook.

    RE2 refuses backreferences and look-around; ``\\w``, ``\\d`` and ``\\b`` are ASCII. Compiled patterns are cached.

    Raises:
        ValueError: the pattern is too long or RE2 cannot compile it (the message says why).

    Example:
        >>> compile_regex(r"^(a+)+$").search("a" * 10_000 + "b") is None
        True
    """
    if not isinstance(pattern, str):
        raise TypeError(f"pattern must be a str, got {type(pattern).__name__}")
    if len(pattern) > MAX_REGEX_CHARS:
        raise ValueError(f"regular expression longer than {MAX_REGEX_CHARS} characters")
    return _compile_re2(pattern)


def findall_utf8(pattern: str, text: str) -> list[str]:
    """``compile_regex(pattern).findall(text)`` for a pattern without capturing groups, matched on the UTF-8 bytes
    (RE2 matches ``str`` in UTF-8 too, so the matches are the same; see :func:`spans_utf8`). ``text`` must encode
    as UTF-8.

    Example:
        >>> findall_utf8(r"\\w+@\\w+\\.io", "Zoë wrote: mail eve@evil.io")
        ['eve@evil.io']
    """
    b = text.encode()
    return [b[i:j].decode() for i, j in spans_utf8(pattern, b)]


def spans_utf8(pattern: str, data: bytes) -> Iterator[tuple[int, int]]:
    """The ``(start, end)`` byte offsets of the successive non-overlapping matches of ``pattern`` (compiled with RE2,
    as :func:`compile_regex`) in UTF-8 ``data``, leftmost first, as ``finditer`` finds them.

    The binding's ``finditer`` builds a match object per match (and on ``str`` converts character and byte offsets
    at every match), which cost more than the matching itself on AgentDojo's tool outputs (issue #36 item 7); this
    loop asks RE2 for the next match's span directly. A test compares it with the binding's ``finditer``.

    Example:
        >>> list(spans_utf8(r"\\d+", "a1 bb22 ë333".encode()))
        [(1, 2), (5, 7), (10, 13)]
    """
    if len(pattern) > MAX_REGEX_CHARS:
        raise ValueError(f"regular expression longer than {MAX_REGEX_CHARS} characters")
    rx = _compile_re2(pattern.encode())
    step = getattr(getattr(rx, "_regexp", None), "Match", None)
    anchor = getattr(getattr(sys.modules.get("re2"), "_Anchor", None), "UNANCHORED", None)
    if step is None or anchor is None:          # another binding version: its own (slower) iterator
        yield from (m.span() for m in rx.finditer(data))
        return
    pos, end = 0, len(data)
    while True:                                  # the binding's loop on str, without its match objects
        i, j = step(anchor, data, pos, end)[0]
        if i < 0:
            return
        yield i, j
        if pos == end:
            return
        if pos == j:                             # an empty match at pos: move on by one character
            pos += 1
            while pos < end and data[pos] & 0xC0 == 0x80:
                pos += 1
        else:
            pos = j


@functools.lru_cache(maxsize=4096)
def _compile_re2(pattern: str | bytes) -> Any:
    from ...common.optional import requires

    re2 = requires("re2", extra="agents", purpose="linear-time regular expressions in AIR rules")
    options = re2.Options()
    options.log_errors = False
    try:
        return re2.compile(pattern, options)
    except re2.error as exc:
        detail = exc.args[0].decode() if exc.args and isinstance(exc.args[0], bytes) else str(exc)
        raise ValueError(f"not supported by the linear-time regex engine (RE2): {detail}") from None
