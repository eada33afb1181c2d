"""AIR's core layer, text normalisation: de-obfuscation, the form taint is compared in, amounts."""

from __future__ import annotations

import functools
import re
import unicodedata
from typing import Any

from .regex import compile_regex

# invisible characters: C0/C1 controls (not whitespace), soft hyphen, zero-width and bidirectional controls, BOM
_INVISIBLE = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u00ad\u061c\u180e\u200b-\u200f\u202a-\u202e"
                        "\u2060-\u2064\u2066-\u206f\ufeff]")
_OBFUSCATION = r"\s*[\[({]\s*(?i:(at|dot))\s*[\])}]\s*"   # "[at]", "( dot )", ...: compiled with RE2 (linear)


def deobfuscate(value: str) -> str:
    """``value`` in NFKC with invisible characters removed, whitespace collapsed and ``[at]``/``(dot)`` written
    as ``@``/``.``; the case is kept (linear time: a character class and an RE2 pattern).

    Example:
        >>> deobfuscate(" Eve [AT] Evil(dot)io\u200b ")
        'Eve@Evil.io'
    """
    if value.isascii():                         # NFKC is the identity on ASCII, which holds no surrogates
        s = " ".join(_INVISIBLE.sub("", value).split())
    else:
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:              # surrogates: pairs joined, lone ones replaced (U+FFFD)
            value = value.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
        s = " ".join(_INVISIBLE.sub("", unicodedata.normalize("NFKC", value)).split())
    if "[" not in s and "(" not in s and "{" not in s:     # no obfuscation without an opening bracket
        return s
    return compile_regex(_OBFUSCATION).sub(lambda m: "@" if m.group(1).lower() == "at" else ".", s)


def normalize(value: str) -> str:
    """The form taint is compared in: :func:`deobfuscate` d (NFKC, invisible characters removed, whitespace
    collapsed, ``[at]``/``(dot)`` written as ``@``/``.``), then case-folded.

    Example:
        >>> normalize(" EVE [at] Evil(dot)io\u200b ")
        'eve@evil.io'
    """
    if len(value) <= _MEMO_CHARS:               # short strings recur (taint, parties, tasks): memoised
        return _normalize_short(value)
    return _normalize(value)


def _normalize(value: str) -> str:
    return " ".join(deobfuscate(value).casefold().split())


_MEMO_CHARS = 512
_normalize_short = functools.lru_cache(maxsize=1 << 15)(_normalize)


class NormalizedStrings(list):
    """A list of normalised strings whose ``in`` normalises the probe (``"EVE@evil.io " in ctx...`` holds); a
    number probe is compared as an amount (``1200.5 in ...`` holds when a tool output said ``$1,200.50``)."""

    def __contains__(self, item: object) -> bool:
        if isinstance(item, int | float) and not isinstance(item, bool):
            amount = canonical_amount(item)
            return amount is not None and super().__contains__(amount)
        return super().__contains__(normalize(item) if isinstance(item, str) else item)


def canonical_amount(value: Any) -> str | None:
    """An amount in one form whatever its writing: ``"$1,200.50"``, ``"1200.5 EUR"`` and ``1200.5`` give
    ``"1200.5"``; None when ``value`` is no number (booleans included).

    Example:
        >>> canonical_amount("€ 1,000.00"), canonical_amount(1000), canonical_amount("ten")
        ('1000', '1000', None)
    """
    from decimal import Decimal, InvalidOperation

    if isinstance(value, bool) or not isinstance(value, str | int | float):
        return None
    if isinstance(value, float) and value != value:       # NaN
        return None
    try:
        if isinstance(value, str):
            digits = "".join(ch for ch in value[:64] if ch.isdigit() or ch in ".-")
            if not any(ch.isdigit() for ch in digits):
                return None
            d = Decimal(digits)
        else:
            d = Decimal(repr(value))
    except InvalidOperation:
        return None
    if not d.is_finite():
        return None
    out = format(d.normalize(), "f")
    return out.rstrip("0").rstrip(".") if "." in out else out
