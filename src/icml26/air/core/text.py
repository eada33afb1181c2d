"""AIR's core layer, text normalisation: de-obfuscation, the form taint is compared in, amounts."""

from __future__ import annotations

import functools
import re
import unicodedata
from typing import Any

from .regex import compile_regex, spans_utf8

# invisible characters: C0/C1 controls (not whitespace), soft hyphen, zero-width and bidirectional controls, BOM
_INVISIBLE = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u00ad\u061c\u180e\u200b-\u200f\u202a-\u202e"
                        "\u2060-\u2064\u2066-\u206f\ufeff]")
_OBFUSCATION = r"\s*[\[({]\s*(?i:(at|dot))\s*[\])}]\s*"   # "[at]", "( dot )", ...: compiled with RE2 (linear)

# issue #49 item 5: the obfuscations v2 missed, undone before taint (each pattern compiled with RE2, linear time).
# Top-level domains a spelled-out, line-split or reversed address must end in to be folded (the web domains
# ``core.entities`` extracts); prose such as "look at the dot matrix" ends in none and is left alone.
TLDS = ("com", "org", "net", "io", "co", "ch", "de", "uk", "info", "biz", "xyz", "fr", "it")
_TLD_SET = frozenset(TLDS)
# Letters of other scripts drawn like Latin ones (UTS #39 confusables, the Cyrillic and Greek letters an attacker
# swaps in: "еve@evil.io" with a Cyrillic е), and the ideographic full stops IDNA reads as a dot (U+3002; U+FF61
# and U+FE12 reach it through NFKC, U+FF0E becomes "." there). Applied after NFKC, case kept.
_CONFUSABLES = str.maketrans(
    # Cyrillic capitals, small letters
    "АВЕКМНОРСТХУЅІЈӀ" "аеорсухѕіјԁһӏԛԝ"
    # Greek capitals, small letters; Latin dotless i, alpha and script g
    "ΑΒΕΖΗΙΚΜΝΟΡΤΥΧ" "οινακρυ" "ıɑɡ" "\u3002\uff61",
    "ABEKMHOPCTXYSIJI" "aeopcyxsijdhlqw"
    "ABEZHIKMNOPTYX" "oivakpu" "iag" "..",
)
# "&#64;", "&#x40;", "&commat;", "%40" (an "@"), and "&#46;", "&#x2e;", "&period;", "%2E" (a "."): only these two
# characters are decoded (decoding every escape would split a URL such as ".../a%20b" at its "%20"); a numeric
# reference ends at its ";" or at the first character that is no digit of it, as in HTML ("&#064evil" is "@evil";
# an ASCII one: the replacement keeps that one byte)
_ESCAPED = (r"&#0*(?:64|46)(?:;|[\x00-\x2f\x3a-\x7f]|$)|&#[xX]0*(?:40|2[eE])(?:;|[\x00-\x2f\x3a-\x40\x47-\x60\x67-\x7f]|$)"
            r"|&(?i:commat|period);|%40|%2[eE]")
# an address split over lines at its "@" ("eve@\nevil.io", "eve\n@evil.io") or after a dot of its domain
# ("eve@evil.\nio"; joined only when the next line starts with a top-level domain and the label before the dot is
# none, so "bob@corp.com.\nit was ..." stays two lines)
_SPLIT_AT = r"[\w.+-][ \t]*(?:\r?\n[ \t]*)+@[\w-]|[\w.+-]@[ \t]*(?:\r?\n[ \t]*)+[\w-]"
_SPLIT_DOT = r"[\w.+-]+@(?:[\w-]+\.)+[ \t]*\r?\n[ \t]*[A-Za-z]{2,4}\b"
# "eve at evil dot io", "eve AT evil DOT io", "files dot evil dot io": words joined by a spelled-out "dot" (one at
# the least) and, optionally, a spelled-out "at" before them; folded only when the last word is a top-level domain
# (whitespace is collapsed to single spaces before this runs)
_SPELLED = r"\b(?:[\w.+-]+ (?i:at) )?[\w-]+(?: (?i:dot) [\w-]+)+\b"


def _replace(pattern: str, s: str, repl: Any) -> str:
    """``s`` with each match of ``pattern`` (RE2 on the UTF-8 bytes, :func:`~icml26.air.core.regex.spans_utf8`)
    replaced by ``repl(match_bytes)``; no match object is built, so a string with many matches stays cheap."""
    b = s.encode()
    pieces: list[bytes] = []
    last = 0
    for i, j in spans_utf8(pattern, b):
        pieces += (b[last:i], repl(b[i:j]))
        last = j
    if not pieces:
        return s
    pieces.append(b[last:])
    return b"".join(pieces).decode()


def _unescape(m: bytes) -> bytes:
    # "&#64;", "&#x40;", "&commat;", "%40" -> "@"; the dot's escapes -> "."; the character ending a reference kept
    digits = b"0123456789abcdefABCDEF" if m[2:3] in (b"x", b"X") else b"0123456789"
    tail = m[-1:] if m[:2] == b"&#" and m[-1:] != b";" and m[-1:] not in digits else b""
    body = m.lower().rstrip(b";")[:len(m) - len(tail)]
    return (b"@" if body.endswith((b"64", b"40", b"commat")) else b".") + tail


def _split_at(m: bytes) -> bytes:
    return m.translate(None, b" \t\r\n")            # "eve@ \n evil.io" -> "eve@evil.io"


def _split_dot(m: bytes) -> bytes:
    left, _, right = m.partition(b"\n")
    left, right = left.rstrip(b" \t\r"), right.strip(b" \t")
    label = left[:-1].rpartition(b".")[2].rpartition(b"@")[2]      # the label before the dot at the line's end
    if right.lower().decode() in _TLD_SET and label.lower().decode() not in _TLD_SET:
        return left + right
    return m


def _spelled(m: bytes) -> bytes:
    words = m.split(b" ")
    user, words = (words[0], words[2:]) if words[1].lower() == b"at" else (b"", words)
    labels = words[::2]                                  # "evil dot co dot uk": evil, co, uk
    if labels[-1].lower().decode() not in _TLD_SET:
        return m                                         # "the dot matrix": prose, left as it is
    host = b".".join(labels)
    return user + b"@" + host if user else host


def deobfuscate(value: str) -> str:
    """``value`` in NFKC with invisible characters removed, whitespace collapsed and the obfuscated separators of an
    address written as ``@`` and ``.``; the case is kept (linear time: translation tables and RE2 patterns).

    Undone: ``[at]``/``(dot)``; Cyrillic and Greek letters drawn like Latin ones (``е`` -> ``e``); ideographic full
    stops (U+3002, U+FF61; U+FF0E through NFKC); the escapes ``&#64;``, ``&#x40;``, ``&commat;``, ``%40`` and
    ``&#46;``, ``&#x2e;``, ``&period;``, ``%2E``; an address split over lines at its ``@`` or after a dot of its
    domain; ``X at Y dot Z`` spelled out (any case) when ``Z`` is a top-level domain (:data:`TLDS`), so prose such
    as "meet at the station" or "the dot matrix" is left alone.

    Example:
        >>> deobfuscate(" Eve [AT] Evil(dot)io\u200b ")
        'Eve@Evil.io'
        >>> deobfuscate("mail \u0435ve AT evil DOT io, eve&#64;evil%2Eio or eve@\\nevil\u3002io; meet at the station")
        'mail eve@evil.io, eve@evil.io or eve@evil.io; meet at the station'
    """
    if not value.isascii():                     # NFKC is the identity on ASCII, which holds no surrogates
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:              # surrogates: pairs joined, lone ones replaced (U+FFFD)
            value = value.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
        value = unicodedata.normalize("NFKC", value).translate(_CONFUSABLES)
    s = _INVISIBLE.sub("", value)
    if "&" in s or "%" in s:
        s = _replace(_ESCAPED, s, _unescape)
    if "\n" in s and "@" in s:
        s = _replace(_SPLIT_DOT, _replace(_SPLIT_AT, s, _split_at), _split_dot)
    s = " ".join(s.split())
    if "[" in s or "(" in s or "{" in s:        # no bracketed obfuscation without an opening bracket
        s = compile_regex(_OBFUSCATION).sub(lambda m: "@" if m.group(1).lower() == "at" else ".", s)
    if " dot " in s.lower():                    # no spelled-out address without a spelled-out dot
        s = _replace(_SPELLED, s, _spelled)
    return s


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
