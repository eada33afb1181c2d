"""The ``icml26`` command: ``list | info SLUG | reproduce [SLUG ...] | report [--check]``.

Exit codes: 0 success; 1 a failed run or stale tables (``report --check``); 2 a usage error (unknown slug,
planned paper, missing extra or module, bad option); 3 a file-system error (e.g. ``--out`` not writable);
130 interrupted (Ctrl-C; the seeds that finished are kept in ``<mode>.partial.json``). Failures are one line on
stderr; ``--debug`` shows the traceback instead.

Example:
    >>> main(["list", "shampoo"])  # doctest: +ELLIPSIS
    #   slug ...
    0
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import textwrap
import time
from collections.abc import Sequence
from pathlib import Path

from . import __version__
from .common.optional import install_hint
from .registry import (
    SYSTEM_PROGRAMS,
    Paper,
    UnknownPaperError,
    get_paper,
    list_papers,
    missing_extras,
    missing_programs,
)


def _parse_seeds(text: str) -> list[int]:
    try:
        seeds = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--seeds must be comma-separated integers, got {text!r}") from None
    if not seeds or any(s < 0 for s in seeds) or len(set(seeds)) != len(seeds):
        raise argparse.ArgumentTypeError(f"--seeds must be distinct non-negative integers, got {text!r}")
    return seeds


MODES_HELP = """modes:
  smoke  one seed, a tiny budget: does the pipeline run (seconds); its verdicts are not evidence
  quick  the card's quick seeds and preset, under 2 minutes a paper on 2 cores: the README's table
  full   the card's full seeds and preset, under 15 minutes a paper: the committed full results
         (a card that needs longer states its budget beside its reason; `icml26 info SLUG` shows it)
Results go to OUT/<slug>/<mode>.json (default ./runs, scratch); plots beside them. To replace a clone's committed
results, run from a clean commit with --out results (scripts/regenerate.py does this in a worktree)."""

#: exit statuses
EXIT_FAILED, EXIT_USAGE, EXIT_OS, EXIT_INTERRUPTED = 1, 2, 3, 130


def _add_llm_options(parser: argparse.ArgumentParser, used_for: str) -> None:
    parser.add_argument("--llm-endpoint", default=None,
                        help=f"OpenAI-compatible base URL for {used_for}(default: $ICML26_LLM_ENDPOINT)")
    parser.add_argument("--llm-model", default=None, help="model name (default: $ICML26_LLM_MODEL)")
    parser.add_argument("--llm-timeout", type=float, default=None,
                        help="seconds per LLM call (default: $ICML26_LLM_TIMEOUT or 30)")


def _export_llm_options(args: argparse.Namespace) -> None:
    """Put ``--llm-*`` into ``ICML26_LLM_*`` so an experiment reads them (``air.llm.client_from_config``)."""
    if args.llm_timeout is not None and not args.llm_timeout > 0:
        raise ValueError(f"--llm-timeout must be a positive number of seconds, got {args.llm_timeout}")
    if args.llm_endpoint and not (args.llm_model or os.environ.get("ICML26_LLM_MODEL")):
        raise ValueError("--llm-endpoint needs a model name (--llm-model or ICML26_LLM_MODEL)")
    if (args.llm_model or args.llm_timeout is not None) and not (args.llm_endpoint
                                                                 or os.environ.get("ICML26_LLM_ENDPOINT")):
        raise ValueError("--llm-model/--llm-timeout need an endpoint (--llm-endpoint or ICML26_LLM_ENDPOINT)")
    for name, value in (("ENDPOINT", args.llm_endpoint), ("MODEL", args.llm_model), ("TIMEOUT", args.llm_timeout)):
        if value is not None:
            os.environ[f"ICML26_LLM_{name}"] = str(value)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="icml26", description="Working implementations and CPU-scale reproductions of ICML 2026 papers.")
    parser.add_argument("--version", action="version", version=f"icml26 {__version__}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks instead of one-line errors")
    # --debug also after the subcommand; SUPPRESS keeps a subcommand from resetting one given before it
    debug = argparse.ArgumentParser(add_help=False)
    debug.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                       help="show tracebacks instead of one-line errors")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p_list = sub.add_parser("list", parents=[debug], help="list the papers (number, slug, kind, status)")
    p_list.add_argument("pattern", nargs="?", help="glob on the slug, or a substring of slug or title")

    p_info = sub.add_parser("info", parents=[debug], help="a paper's card: claims, extras, how to reproduce")
    p_info.add_argument("slug")

    p_rep = sub.add_parser("reproduce", parents=[debug], help="run reproductions and write OUT/<slug>/<mode>.json",
                           formatter_class=argparse.RawDescriptionHelpFormatter, description=MODES_HELP)
    p_rep.add_argument("slugs", nargs="*", metavar="SLUG", help="papers to run (or --all)")
    p_rep.add_argument("--all", action="store_true",
                       help="every implemented paper whose extras are installed (the others are listed as skipped)")
    p_rep.add_argument("--mode", choices=("smoke", "quick", "full"), default="quick",
                       help="smoke (seconds: does it run), quick (default; < 2 min a paper), full (< 15 min a "
                            "paper); or the card's stated budget; see below")
    p_rep.add_argument("--seeds", type=_parse_seeds, default=None, help="e.g. 0,1,2 (default: the card's)")
    p_rep.add_argument("--out", type=Path, default=Path("runs"),
                       help="results root (default: ./runs, a scratch directory; give --out results on purpose to "
                            "replace the committed results of a clone)")
    p_rep.add_argument("--force", action="store_true",
                       help="overwrite an existing OUT/<slug>/<mode>.json even when it ran other seeds")
    _add_llm_options(p_rep, "AIR's semantic(...) checks and LLM rule synthesis; other papers ignore it. ")

    p_report = sub.add_parser("report", parents=[debug], help="regenerate the README tables from results/")
    p_report.add_argument("--check", action="store_true", help="change nothing; exit 1 if a table is stale")
    p_report.add_argument("--root", type=Path, default=None, help="project root (default: found from cwd)")

    p_air = sub.add_parser("air", parents=[debug], help="AIR tools: `icml26 air check FILE...` lints incident-response rule files")
    air_sub = p_air.add_subparsers(dest="air_command", required=True, metavar="ACTION")
    p_check = air_sub.add_parser("check", parents=[debug], help="parse and validate rule files; report file:line:column: problem")
    p_check.add_argument("files", nargs="+", type=Path, metavar="FILE")
    p_check.add_argument("--semantic", action="store_true",
                         help="a semantic(...) backend will be configured (else such checks are reported)")
    p_check.add_argument("--manifest", default=None, metavar="FILE|NAME",
                         help="tool manifest (TOML or JSON file, or a shipped one: shell, email, household, banking, "
                              "slack, workspace, travel): refuse tools, call.args and state paths it does not declare")
    p_proxy = air_sub.add_parser("proxy", parents=[debug], help="an MCP server enforcing AIR rules in front of another MCP server: "
                                 "icml26 air proxy --rules FILE|NAME [--manifest FILE] -- COMMAND ARGS...")
    p_proxy.add_argument("--rules", required=True, metavar="FILE|NAME",
                         help="AIR rule file, or a rule set shipped with AIR (e.g. generic: needs --manifest)")
    p_proxy.add_argument("--manifest", type=Path, default=None,
                         help="tool manifest (TOML or JSON): effect classes, targets, inverse operations")
    p_proxy.add_argument("--task", default="",
                         help="the user's task until the client sends one (request _meta \"air/task\")")
    p_proxy.add_argument("--state-uri", default=None, metavar="URI",
                         help="upstream resource holding the state view as a JSON object (default: state://view "
                              "when offered; given: required)")
    p_proxy.add_argument("--log", type=Path, default=None, help="append incidents as JSON lines here")
    _add_llm_options(p_proxy, "semantic(...) checks. ")
    p_proxy.add_argument("upstream", nargs=argparse.REMAINDER, help="-- COMMAND ARGS... of the upstream server")
    return parser


def _cmd_list(args: argparse.Namespace) -> int:
    papers = list_papers(args.pattern)
    if not papers:
        print(f"no paper matches {args.pattern!r}", file=sys.stderr)
        return 1
    width = max(len(p.slug) for p in papers)
    kwidth = max(len(p.kind) for p in papers)
    print(f"{'#':<3} {'slug':<{width}}  {'kind':<{kwidth}}  {'status':<11}  paper")
    for p in papers:
        print(f"{p.number:02d}  {p.slug:<{width}}  {p.kind:<{kwidth}}  {p.status:<11}  {p.short}")
    return 0


def _extras_line(paper: Paper, which: str) -> str:
    extras = getattr(paper, which)
    if not extras:
        return "none"
    missing, absent = missing_extras(paper, which), missing_programs(paper, which)
    parts = []
    for e in extras:
        state = "missing: " + install_hint(e) if e in missing else "installed"
        if e in absent:
            progs = " ".join(absent[e])
            state += f"; system programs not on PATH: {progs} (apt-get install -y {progs})"
        elif SYSTEM_PROGRAMS.get(e):
            state += f"; system programs found: {', '.join(SYSTEM_PROGRAMS[e])}"
        parts.append(f"{e} ({state})")
    return ", ".join(parts)


def _cmd_info(args: argparse.Namespace) -> int:
    p = get_paper(args.slug)
    wrap = lambda s, ind="  ": textwrap.fill(s, 100, initial_indent=ind, subsequent_indent=ind)  # noqa: E731
    print(f"{p.number:02d} {p.slug} — {p.title}")
    print(f"  {p.venue}; {p.authors}" if p.authors else f"  {p.venue}")
    print(f"  {p.url}")
    print(f"  official code: {p.code}")
    print(f"  kind: {p.kind}; component: {p.component}")
    print(f"  status: {p.status}" + (f" (issue #{p.issue})" if p.issue else ""))
    print(f"  extras to reproduce: {_extras_line(p, 'extras')}")
    print(f"  extras for the ecosystem adapters: {_extras_line(p, 'component_extras')}")
    print()
    print(wrap(p.summary))
    if p.reconstructed:
        print()
        print(wrap("Reconstructed: " + p.reconstructed))
    print("\nclaims:")
    for c in p.claims:
        print(f"- {c.id}{' (headline)' if c.headline else ''}: {c.text}")
        print(f"    paper: {c.paper}")
        print(f"    check: {c.check.text}   [{c.kind}; modes: {', '.join(c.modes)}]")
        if c.min_effect_why:
            print(f"    why this threshold: {c.min_effect_why}")
    print(f"\ntorch: {_torch_build()}")
    print("\nmodes:")
    for m in p.modes.values():
        print(f"  {m.name}: seeds {list(m.seeds)}, budget {m.budget_s:.0f} s")
    if p.implemented:
        print(f"\nreproduce: icml26 reproduce {p.slug} --mode quick")
    else:
        print(f"\n{p.slug} is not implemented yet.")
    return 0


def _seed_clash(paper: Paper, mode: str, seeds: Sequence[int] | None, out: Path) -> str | None:
    """Why writing ``out/<slug>/<mode>.json`` would replace a result of other seeds (``None`` if it would not)."""
    import json

    path = out / paper.slug / f"{mode}.json"
    if not path.is_file():
        return None
    try:
        old = json.loads(path.read_text(encoding="utf-8")).get("seeds")
    except (OSError, ValueError, AttributeError):
        return None
    new = list(paper.modes[mode].seeds if seeds is None else seeds)
    if old is None or list(old) == new:
        return None
    return f"{path} holds a result of seeds {old}; this run would replace it with seeds {new}"


def _torch_build() -> str:
    """Which torch is installed (read from its metadata and version module; nothing imports CUDA)."""
    import importlib.metadata
    import importlib.util

    try:
        version = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return "not installed (the papers that need it name the extra to install)"
    spec = importlib.util.find_spec("torch")  # a top-level spec: nothing is imported
    version_py = Path(spec.origin).parent / "version.py" if spec is not None and spec.origin else None
    cuda = None
    if version_py is not None and version_py.is_file():
        m = re.search(r"^cuda\s*(?::\s*\S+)?\s*=\s*['\"]([^'\"]+)['\"]", version_py.read_text(), re.M)
        cuda = m.group(1) if m else None
    return f"{version}, " + (f"a CUDA {cuda} build" if cuda else "the CPU build")


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def _summary(rows: list[tuple[str, str, str, str]]) -> str:
    """``paper  claim  verdict  ours`` lines that fit 100 columns."""
    lines = [f"{'paper':<16} {'claim':<26} {'verdict':<12} estimate [one-sided 95 % bounds]"]
    for slug, cid, verdict, ours in rows:
        lines.append(_clip(f"{_clip(slug, 16):<16} {_clip(cid, 26):<26} {verdict:<12} {ours}", 100))
    return "\n".join(lines)


def _cmd_reproduce(args: argparse.Namespace) -> int:
    from .common.claims import describe_interval
    from .runner import check_writable, run_paper

    skipped: list[str] = []
    if args.slugs and args.all:
        print("error: give paper slugs or --all, not both", file=sys.stderr)
        return EXIT_USAGE
    if args.slugs:
        papers = [get_paper(s) for s in args.slugs]  # UnknownPaperError -> exit 2 in main
        planned = [p.slug for p in papers if not p.implemented]
        if planned:
            print(f"error: not implemented yet: {', '.join(planned)} (status: planned; see `icml26 info SLUG`)",
                  file=sys.stderr)
            return EXIT_USAGE
        for p in papers:
            missing = missing_extras(p)
            if missing:
                hints = " && ".join(install_hint(e) for e in missing)
                print(f"error: {p.slug} needs extras {sorted(missing)} that are not installed; run: {hints}",
                      file=sys.stderr)
                return EXIT_USAGE
    elif args.all:
        papers = []
        for p in list_papers():
            missing = missing_extras(p) if p.implemented else {}
            if not p.implemented:
                continue
            if missing:
                skipped.append(f"{p.slug} (needs {', '.join(install_hint(e) for e in missing)})")
            else:
                papers.append(p)
    else:
        print("error: name the papers to reproduce, or --all for every implemented one "
              "(this overwrites OUT/<slug>/<mode>.json)", file=sys.stderr)
        return EXIT_USAGE
    try:
        _export_llm_options(args)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        check_writable(args.out)
    except OSError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_OS
    clashes = [c for p in papers if (c := _seed_clash(p, args.mode, args.seeds, args.out)) and not args.force]
    if clashes:
        print("error: " + "; ".join(clashes) + ". Give another --out (e.g. a scratch directory) or --force.",
              file=sys.stderr)
        return EXIT_USAGE
    rows: list[tuple[str, str, str, str]] = []
    failed = False
    for p in papers:
        started = time.time()
        try:
            result = run_paper(p, mode=args.mode, seeds=args.seeds, out_dir=args.out)
        except KeyboardInterrupt as exc:
            kept = getattr(exc, "partial_result", None)
            print(f"\ninterrupted: {p.slug}" + (f"; the seeds that finished are in {kept}" if kept else ""),
                  file=sys.stderr)
            return EXIT_INTERRUPTED
        except Exception as exc:
            if args.debug:
                raise
            kept = getattr(exc, "partial_result", None)
            print(f"error: {p.slug}: {_one_line(exc, p)}" + (f" (finished seeds kept in {kept})" if kept else ""),
                  file=sys.stderr)
            if isinstance(exc, ImportError):
                return EXIT_USAGE
            if isinstance(exc, OSError):
                return EXIT_OS
            failed = True
            continue
        for c in result["claims"]:
            rows.append((p.slug, c["id"] + (" (sanity)" if c["kind"] == "sanity" else ""), c["verdict"],
                         f"{describe_interval(c)}"))
        target = args.out / p.slug
        print(f"{p.slug}: wrote {target / (args.mode + '.json')}", file=sys.stderr)
        for plot in sorted(target.glob(f"{args.mode}_*.png")):
            if plot.stat().st_mtime >= started - 1:
                print(f"{p.slug}: plot {plot}", file=sys.stderr)
    if rows:
        print(_summary(rows))
        if args.mode == "smoke":
            print("smoke: one seed and a tiny budget check that the pipeline runs; these verdicts (fails "
                  "included) are not evidence about the papers: run --mode quick or full", file=sys.stderr)
    if skipped:
        print("skipped (missing extras): " + "; ".join(skipped), file=sys.stderr)
    return EXIT_FAILED if failed else 0


def _one_line(exc: BaseException, paper: Paper) -> str:
    """A failure as one line: what went wrong, and what to do where we know it."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    if isinstance(exc, ModuleNotFoundError) and exc.name:
        extras = " or ".join(install_hint(e) for e in paper.extras) or "pip install the missing package"
        return f"module {exc.name!r} is not installed ({extras})"
    if isinstance(exc, OSError) and not str(exc).startswith("cannot write"):
        return f"{type(exc).__name__}: {text}"
    from .runner import ReproduceError

    return text if isinstance(exc, (ReproduceError, ImportError)) else f"{type(exc).__name__}: {text}"


def _cmd_report(args: argparse.Namespace) -> int:
    from .report import ReportError, update

    try:
        outcome = update(args.root, check=args.check)
    except ReportError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for notice in outcome.notices:
        print(f"note: {notice}", file=sys.stderr)
    for problem in outcome.problems:
        print(f"problem: {problem}", file=sys.stderr)
    verb = "stale" if args.check else "updated"
    for path in outcome.changed:
        print(f"{verb}: {path}")
    if args.check:
        if not outcome.ok:
            print("tables are stale or results are missing; run `icml26 report` (after `icml26 reproduce`)",
                  file=sys.stderr)
            return 1
        print("report: all tables are up to date")
        return 0
    return 1 if outcome.problems else 0


def _cmd_air(args: argparse.Namespace) -> int:
    from .common.optional import MissingExtraError

    try:
        from . import air  # noqa: F401  (the agents extra is installed)
    except MissingExtraError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.air_command == "proxy":
        return _cmd_air_proxy(args)
    return _cmd_air_check(args)


def _check_manifest(spec: str) -> object:
    """``air check --manifest``: a manifest file, or the name of a shipped one (ValueError: neither)."""
    from .air.policy.manifest import AGENTDOJO, EMBEDDED

    if Path(spec).is_file():
        from .air.policy.manifest_file import load_manifest

        return load_manifest(spec)
    shipped = {**EMBEDDED, **AGENTDOJO}
    if spec in shipped:
        return shipped[spec]
    raise ValueError(f"no such manifest file, nor a shipped manifest: {spec} (shipped: {', '.join(shipped)})")


def _cmd_air_check(args: argparse.Namespace) -> int:
    """``icml26 air check``: every problem as ``file:line:column: message`` (exit 1), never a traceback."""
    from . import air
    from .air.dsl import RuleSchema, read_rule_text

    debug = bool(getattr(args, "debug", False))
    manifest = None
    if args.manifest is not None:
        try:
            manifest = _check_manifest(args.manifest)
        except (ValueError, OSError) as exc:
            if debug:
                raise
            print(f"error: {exc}", file=sys.stderr)
            return EXIT_USAGE
    problems = 0
    for path in args.files:
        if not path.is_file():
            print(f"{path}: no such file", file=sys.stderr)
            problems += 1
            continue
        try:
            text = read_rule_text(path)
            diagnostics = air.lint(text, file=str(path), schema=RuleSchema(semantic=args.semantic),
                                   manifest=manifest)
        except air.RuleSyntaxError as exc:
            diagnostics = [exc]
        except OSError as exc:
            diagnostics = [f"{path}:1:1: cannot read: {exc.strerror or exc}"]
        except Exception as exc:  # a linter bug: still one positioned line (--debug: the traceback)
            if debug:
                raise
            diagnostics = [f"{path}:1:1: internal error while checking: {type(exc).__name__}: {exc}"]
        for d in diagnostics:
            print(d)
        problems += len(diagnostics)
        if not diagnostics:
            print(f"{path}: ok ({len(air.parse(text, file=str(path)))} rules)")
    return 1 if problems else 0


def _cmd_air_proxy(args: argparse.Namespace) -> int:
    """``icml26 air proxy``: usage problems (no or missing upstream command, rules, manifest) are one line, exit 2."""
    import shutil

    from . import air
    from .common.optional import MissingExtraError

    command = [c for c in args.upstream if c != "--"] if args.upstream[:1] == ["--"] else args.upstream
    if not command:
        print("error: give the upstream server's command after --", file=sys.stderr)
        return EXIT_USAGE
    if shutil.which(command[0]) is None:
        print(f"error: upstream command not found: {command[0]}", file=sys.stderr)
        return EXIT_USAGE
    if args.manifest is not None and not args.manifest.is_file():
        print(f"error: no such manifest file: {args.manifest}", file=sys.stderr)
        return EXIT_USAGE
    try:
        from .air.integrations import mcp as air_mcp
    except MissingExtraError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    from .air.llm import client_from_config

    try:
        llm = client_from_config(args.llm_endpoint, args.llm_model, args.llm_timeout)
        return air_mcp.main(args.rules, command, args.task, str(args.log) if args.log else None, llm=llm,
                            manifest=str(args.manifest) if args.manifest else None, state_uri=args.state_uri,
                            debug=bool(getattr(args, "debug", False)))
    except (ValueError, air.RuleSyntaxError) as exc:
        if getattr(args, "debug", False):
            raise
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE


COMMANDS = {"list": _cmd_list, "info": _cmd_info, "reproduce": _cmd_reproduce, "report": _cmd_report,
            "air": _cmd_air}


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI with ``argv`` (default ``sys.argv[1:]``) and return the exit code."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse exits 2 on bad usage, 0 on --help/--version
        return int(exc.code or 0)
    try:
        return COMMANDS[args.command](args)
    except UnknownPaperError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


def entry() -> None:
    """Console-script entry point."""
    try:
        code = main()
        sys.stdout.flush()
    except BrokenPipeError:  # e.g. `icml26 info x | head`
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        code = 0
    sys.exit(code)


if __name__ == "__main__":
    entry()
