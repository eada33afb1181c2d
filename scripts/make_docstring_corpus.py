"""Regenerate ``src/icml26/common/data/docstrings.tsv``: first sentences of Python 3.11 stdlib docstrings.

Each row is ``label<TAB>sentence``; the label is the family of the module the docstring comes from (filesystem,
network, concurrency, ...). The file is shipped so that the corpus does not depend on the running Python.
Run: ``.venv/bin/python scripts/make_docstring_corpus.py``.
"""

from __future__ import annotations

import importlib
import inspect
import re
import sys
import warnings
from pathlib import Path

GROUPS = {
    "filesystem": ["os", "os.path", "shutil", "pathlib", "glob", "fnmatch", "tempfile", "filecmp", "stat", "io"],
    "network": ["socket", "ssl", "http.client", "http.server", "http.cookies", "urllib.request", "urllib.parse",
                "smtplib", "ftplib", "imaplib", "poplib", "email.message", "email.utils", "email.parser",
                "email.mime.text", "socketserver", "xmlrpc.client", "ipaddress"],
    "concurrency": ["threading", "multiprocessing", "multiprocessing.pool", "asyncio", "asyncio.streams",
                    "asyncio.tasks", "asyncio.events", "asyncio.queues", "asyncio.locks", "concurrent.futures",
                    "queue", "subprocess", "sched", "selectors", "signal"],
    "text": ["string", "re", "textwrap", "difflib", "unicodedata", "codecs", "html", "html.parser", "locale",
             "gettext", "shlex"],
    "formats": ["json", "csv", "xml.etree.ElementTree", "xml.dom.minidom", "xml.sax", "configparser", "plistlib",
                "pickle", "zipfile", "tarfile", "gzip", "bz2", "lzma", "base64", "binascii", "struct", "mailbox",
                "wave"],
    "numbers": ["math", "cmath", "decimal", "fractions", "random", "statistics", "numbers", "hashlib", "hmac",
                "secrets"],
    "debugging": ["unittest", "unittest.mock", "doctest", "pdb", "bdb", "traceback", "inspect", "dis", "trace",
                  "cProfile", "profile", "pstats", "timeit", "logging", "logging.handlers", "warnings",
                  "tracemalloc", "faulthandler"],
    "datatypes": ["collections", "itertools", "functools", "heapq", "bisect", "array", "copy", "enum",
                  "dataclasses", "typing", "operator", "weakref", "types", "contextlib", "abc", "graphlib"],
    "time": ["datetime", "time", "calendar", "zoneinfo"],
}


def first_sentence(doc: str) -> str:
    para = inspect.cleandoc(doc).strip().split("\n\n")[0].replace("\n", " ")
    m = re.match(r"(.+?[.!?])(\s|$)", para)
    return re.sub(r"\s+", " ", (m.group(1) if m else para).strip())


def members(mod, name):
    for attr, obj in sorted(vars(mod).items()):
        if attr.startswith("_") or not (inspect.isclass(obj) or inspect.isroutine(obj)):
            continue
        if getattr(obj, "__module__", None) != name and not inspect.isroutine(obj):
            continue
        yield obj
        if inspect.isclass(obj):
            for meth_name, meth in sorted(vars(obj).items()):
                if not meth_name.startswith("_") and (inspect.isroutine(meth) or isinstance(meth, property)):
                    yield meth


def build() -> list[tuple[str, str]]:
    rows, seen = [], set()
    for label, modules in GROUPS.items():
        for name in modules:
            mod = importlib.import_module(name)
            for obj in members(mod, name):
                doc = getattr(obj, "__doc__", None)
                if not isinstance(doc, str) or not doc:
                    continue
                s = first_sentence(doc)
                if 25 <= len(s) <= 160 and s not in seen and s.count("(") <= 2 and "->" not in s and "\t" not in s:
                    seen.add(s)
                    rows.append((label, s))
    return rows


def main() -> None:
    if sys.version_info[:2] != (3, 11):
        raise SystemExit("the shipped corpus was built with Python 3.11; use it to regenerate")
    warnings.simplefilter("ignore", DeprecationWarning)
    out = Path(__file__).resolve().parents[1] / "src" / "icml26" / "common" / "data" / "docstrings.tsv"
    rows = build()
    out.write_text("".join(f"{label}\t{s}\n" for label, s in rows), encoding="utf-8")
    print(f"wrote {len(rows)} sentences to {out}")


if __name__ == "__main__":
    main()
