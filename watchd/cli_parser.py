"""The ``watchd`` command line's grammar: every command, its arguments and their help (docs/cli.md). The
shell completion (:mod:`watchd.completion`) is generated from this tree; :mod:`watchd.cli` dispatches it."""

from __future__ import annotations

import argparse
from pathlib import Path

from watchd import __version__
from watchd.reach import add_arguments as add_reach_arguments
from watchd.reports.formats import REPORT_FORMATS

LOG_LEVELS = ["debug", "info", "warning", "error"]
SHELLS = ("bash", "zsh")

EPILOG = """exit status: 0 done; 1 failed (a check or test failed, a rule file has problems, the engine
could not do it); 2 usage (the command line or a file it names is wrong); 3 the engine is unreachable (or
not ready); 4 refused by the engine (401, 403, 409); 5 not enabled on that engine. Details: docs/cli.md"""


def _json(parser: argparse.ArgumentParser, what: str = "the result as JSON") -> None:
    parser.add_argument("--json", action="store_true", help=what)


def _by(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--by", help="who decides (default: your user name), recorded in the audit")


def _log_level(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--log-level", choices=LOG_LEVELS, help="log this level and above (default: the config's log.level)"
    )


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="watchd",
        description="Keeps GPU clusters healthy.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--version", action="version", version=f"watchd {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", required=True)

    e = sub.add_parser("engine", help="run the central engine (ingest, rules, actions)")
    e.add_argument("-c", "--config", type=Path, help="engine YAML config (default: embedded defaults)")
    e.add_argument("--check", action="store_true", help="validate the config and rules, then exit")
    _log_level(e)

    a = sub.add_parser("agent", help="run the node agent (kernel log -> events -> engine)")
    a.add_argument("-c", "--config", type=Path, help="agent YAML config (default: embedded defaults)")
    a.add_argument("--check", action="store_true", help="validate the config, then exit")
    _log_level(a)

    # the per-job heartbeat token a Slurm prolog or a pod spec hands to a job (docs/security.md)
    ht = sub.add_parser("heartbeat-token", help="print a job's heartbeat token (WATCHD_HEARTBEAT_TOKEN)")
    ht.add_argument("job", help="the job as its ranks name it (SLURM_JOB_ID, WATCHD_JOB_ID)")
    ht.add_argument("-c", "--config", type=Path, help="agent YAML config (its heartbeat.token_secret)")

    x = sub.add_parser("xid", help="decode NVIDIA Xid errors from kernel log text (dmesg | watchd xid)")
    files = x.add_argument("files", nargs="*", help="files to read ('-' or none: standard input)")
    files.completes_files = True  # type: ignore[attr-defined]  # read by watchd.completion
    _json(x, "one JSON object per Xid")

    d = sub.add_parser("demo", help="an engine and simulated nodes on loopback; an Xid 79 is injected")
    d.add_argument("--nodes", type=int, default=4, help="simulated nodes (default 4)")

    sm = sub.add_parser("sim", help="simulate a fleet of GPU nodes (agents in one process) against an engine")
    sm.add_argument("fleet", type=Path, help="fleet scenario YAML (nodes, GPUs, jobs, faults)")
    sm.add_argument("--url", help="the engine ($WATCHD_URL; default http://127.0.0.1:9120)")
    sm.add_argument("--token-file", type=Path, help="the agents' token ($WATCHD_TOKEN, $WATCHD_TOKEN_FILE)")
    sm.add_argument(
        "--duration", type=float, help="seconds to run (default: the fleet's, else until stopped)"
    )
    sm.add_argument("--progress", type=float, default=10.0, help="seconds between progress lines (0: none)")
    sm.add_argument("--log-level", choices=LOG_LEVELS, default="warning")
    sm.add_argument("--check", action="store_true", help="validate the fleet file, then exit")

    _node(sub)
    _checks(sub)
    _rules(sub)

    st = sub.add_parser("status", help="what the engine sees and did: incidents, held actions, breaker")
    st.add_argument("--limit", type=int, help="nodes shown (troubled first; the engine's default: 500)")
    st.add_argument("--node", help="only this node, or the nodes with a prefix ending in '*'")
    _json(st, "the engine's status document")
    add_reach_arguments(st)

    ac = sub.add_parser("actions", help="list, release or discard actions the safety breaker held")
    ac.add_argument("verb", choices=["list", "release", "discard"])
    ac.add_argument("ids", nargs="*", type=int, help="held action ids (release, discard)")
    _by(ac)
    _json(ac, "the held actions (list), or each id's outcome")
    add_reach_arguments(ac)

    rb = sub.add_parser("reliability", help="failures, MTBF with its interval, lemons, checkpoint advice")
    rb.add_argument("--partition", help="only this partition's nodes")
    rb.add_argument("--since", help="window start: epoch seconds or a duration back (30d, 12h; default 90d)")
    rb.add_argument("--job", help="the checkpoint advice for one running job")
    _json(rb, "the engine's document")
    add_reach_arguments(rb)

    dr = sub.add_parser("drains", help="every node out of service in the fleet, who took it out and why")
    dr.add_argument("--refresh", action="store_true", help="list the fleet now, not the last poll")
    dr.add_argument("--owner", choices=("watchd", "nhc", "scheduler", "admin", "other"), help="only these")
    _json(dr, "the engine's document")
    add_reach_arguments(dr)

    _report(sub)

    co = sub.add_parser("completion", help="print the shell completion script (bash or zsh)")
    co.add_argument("shell", choices=SHELLS)
    co.epilog = (
        'bash: eval "$(watchd completion bash)" in ~/.bashrc, or save it as '
        "/etc/bash_completion.d/watchd; zsh: watchd completion zsh > ~/.zfunc/_watchd (fpath+=(~/.zfunc); "
        'autoload -U compinit; compinit) or eval "$(watchd completion zsh)" in ~/.zshrc'
    )

    sub.add_parser("version", help="print the version")
    return p


def _node(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    n = sub.add_parser("node", help="act on one node through the running engine (audited)")
    nsub = n.add_subparsers(dest="node_command", metavar="ACTION", required=True)
    r = nsub.add_parser("resume", help="return a node watchd drained to service (never an admin's drain)")
    r.add_argument("name")
    _by(r)
    _json(r, "the engine's answer")
    add_reach_arguments(r)

    v = nsub.add_parser("validate", help="run the check suite; resume the node only if every check passes")
    v.add_argument("name")
    _by(v)
    v.add_argument("--timeout", type=float, default=3600.0, help="seconds to wait for the checks")
    _json(v, "the engine's answer: every check's verdict and the outcome")
    add_reach_arguments(v)

    um = nsub.add_parser(
        "unmark", help="clear a node's lemon or left-for-a-person mark so watchd may remediate and return it"
    )
    um.add_argument("name")
    um.add_argument("--why", required=True, help="why it is cleared (e.g. the RMA ticket): audited")
    um.add_argument("--mark", choices=["lemon", "left_for_a_person"], help="only this mark (default: all)")
    _by(um)
    _json(um, "the engine's answer")
    add_reach_arguments(um)

    mk = nsub.add_parser(
        "marks", help="the marks that keep nodes out (every marked node, or one node's history)"
    )
    mk.add_argument("name", nargs="?")
    _json(mk, "the raw document")
    add_reach_arguments(mk)

    hi = nsub.add_parser("history", help="the node's incidents: evidence, every step, the return to service")
    hi.add_argument("name")
    hi.add_argument("--limit", type=int, default=20, help="incidents to show, newest first")
    _json(hi, "the raw document")
    add_reach_arguments(hi)


def _checks(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    ck = sub.add_parser(
        "checks", help="active checks: list them, run them on nodes, a node's history, the next round's order"
    )
    ck.add_argument("verb", choices=["list", "run", "history", "plan"])
    ck.add_argument("nodes", nargs="*", help="nodes (run, history)")
    ck.add_argument("--check", action="append", default=[], help="run only this check (repeatable)")
    _by(ck)
    ck.add_argument("--timeout", type=float, default=3600.0, help="seconds to wait for the checks")
    _json(ck, "the raw documents")
    add_reach_arguments(ck)


def _rules(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    rl = sub.add_parser("rules", help="check, test and describe rule files")
    rsub = rl.add_subparsers(dest="rules_command", metavar="ACTION", required=True)
    rc = rsub.add_parser("check", help="report every problem with file:line:column; exit 1 on any")
    rli = rsub.add_parser("list", help="the rules the engine would run, and where each one came from")
    for parser in (rc, rli):
        parser.add_argument(
            "paths", nargs="*", type=Path, help="site rule files or folders (none: the embedded defaults)"
        )
        parser.add_argument(
            "-c",
            "--config",
            type=Path,
            help="engine YAML config: its rules and default_rules (not with PATHS)",
        )
        parser.add_argument(
            "--no-defaults",
            action="store_true",
            help="without the embedded default rules (default_rules: false)",
        )
    _json(rc, "every problem as a JSON object (file, line, column, message), and the summary")
    _json(rli, "one JSON document")
    rt = rsub.add_parser("test", help="run rule unit tests (timelines of events and expected actions)")
    rt.add_argument(
        "paths", nargs="+", type=Path, help="test files, or folders (every *.yaml/*.yml test file in them)"
    )
    _json(rt, "every test's result as one JSON document")
    rt.add_argument("--junit", type=Path, metavar="FILE", help="also write a JUnit XML report here (for CI)")
    rsub.add_parser("schema", help="print the JSON Schema of rule files (for editors)")


def _report(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    # per-team usage, queue waits, energy, lost GPU-hours (docs/reports.md)
    rp = sub.add_parser("report", help="reports from accounting and what watchd observed")
    rpsub = rp.add_subparsers(dest="report_command", metavar="REPORT", required=True)
    ru = rpsub.add_parser("usage", help="GPU-hours, shares, waits, energy, lost and idle GPU-hours per team")
    ru.add_argument("--since", default="7d", help="window start, this long ago (default 7d)")
    ru.add_argument("--until", help="window end, this long ago (default: now)")
    ru.add_argument(
        "--by", default="account", help="comma list of account, user, partition (default account)"
    )
    ru.add_argument(
        "--format",
        choices=list(REPORT_FORMATS),
        default="table",
        help="; ".join(f"{name}: {row.description}" for name, row in REPORT_FORMATS.items()),
    )
    ru.add_argument(
        "--source", choices=["slurm", "none", "fake"], help="accounting (default: config, else slurm)"
    )
    ru.add_argument("--fixture", type=Path, help="source fake: a JSON file of records")
    ru.add_argument("--state", type=Path, help="the engine's state database (default: from --config)")
    ru.add_argument("-c", "--config", type=Path, help="engine YAML config (reports section, state path)")
    ru.add_argument("--idle-threshold", type=float, help="GPU utilization %% under which a window is idle")
    ru.add_argument("-o", "--output", type=Path, help="write here instead of standard output")
