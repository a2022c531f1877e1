"""The ``watchd`` command line. User mistakes are one line on stderr and exit code 2, never a traceback."""

from __future__ import annotations

import argparse
import asyncio
import os
import select
import signal
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TextIO

from watchd import __version__
from watchd.config import AgentConfig, EngineConfig, load_config
from watchd.errors import ConfigError, UsageError
from watchd.logs import configure_logging, writes_to_journal
from watchd.operator_cli import DEFAULT_URL
from watchd.reports.formats import REPORT_FORMATS
from watchd.systemd import notify, watchdog_pinger

LOG_LEVELS = ["debug", "info", "warning", "error"]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="watchd", description="Keeps GPU clusters healthy.")
    p.add_argument("--version", action="version", version=f"watchd {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", required=True)

    e = sub.add_parser("engine", help="run the central engine (ingest, rules, actions)")
    e.add_argument("-c", "--config", type=Path, help="engine YAML config (default: embedded defaults)")
    e.add_argument("--check", action="store_true", help="validate the config and rules, then exit")
    e.add_argument(
        "--log-level", choices=LOG_LEVELS, help="log this level and above (default: the config's log.level)"
    )

    a = sub.add_parser("agent", help="run the node agent (kernel log -> events -> engine)")
    a.add_argument("-c", "--config", type=Path, help="agent YAML config (default: embedded defaults)")
    a.add_argument("--check", action="store_true", help="validate the config, then exit")
    a.add_argument(
        "--log-level", choices=LOG_LEVELS, help="log this level and above (default: the config's log.level)"
    )

    # issue 22: the per-job heartbeat token a Slurm prolog or a pod spec hands to a job (docs/security.md)
    ht = sub.add_parser("heartbeat-token", help="print a job's heartbeat token (WATCHD_HEARTBEAT_TOKEN)")
    ht.add_argument("job", help="the job as its ranks name it (SLURM_JOB_ID, WATCHD_JOB_ID)")
    ht.add_argument("-c", "--config", type=Path, help="agent YAML config (its heartbeat.token_secret)")

    x = sub.add_parser("xid", help="decode NVIDIA Xid errors from kernel log text (dmesg | watchd xid)")
    x.add_argument("files", nargs="*", help="files to read ('-' or none: standard input)")
    x.add_argument("--json", action="store_true", help="one JSON object per Xid")

    d = sub.add_parser("demo", help="an engine and simulated nodes on loopback; an Xid 79 is injected")
    d.add_argument("--nodes", type=int, default=4, help="simulated nodes (default 4)")

    sm = sub.add_parser("sim", help="simulate a fleet of GPU nodes (agents in one process) against an engine")
    sm.add_argument("fleet", type=Path, help="fleet scenario YAML (nodes, GPUs, jobs, faults)")
    sm.add_argument("--url", default=DEFAULT_URL, help=f"the engine (default {DEFAULT_URL})")
    sm.add_argument("--token-file", type=Path, help="the engine's token (default: $WATCHD_TOKEN)")
    sm.add_argument(
        "--duration", type=float, help="seconds to run (default: the fleet's, else until stopped)"
    )
    sm.add_argument("--progress", type=float, default=10.0, help="seconds between progress lines (0: none)")
    sm.add_argument("--log-level", choices=LOG_LEVELS, default="warning")
    sm.add_argument("--check", action="store_true", help="validate the fleet file, then exit")

    n = sub.add_parser("node", help="act on one node through the running engine (audited)")
    nsub = n.add_subparsers(dest="node_command", metavar="ACTION", required=True)
    r = nsub.add_parser("resume", help="return a node watchd drained to service (never an admin's drain)")
    r.add_argument("name")
    r.add_argument("--url", help=f"the engine (default: from --config, else {DEFAULT_URL})")
    r.add_argument(
        "--token-file", type=Path, help="the engine's token (default: from --config, $WATCHD_TOKEN)"
    )
    r.add_argument("--by", help="who decides (default: your user name), recorded in the audit")
    r.add_argument("-c", "--config", type=Path, help="engine YAML config: the engine's address and token")

    # issue 21: active checks and the validated return to service
    v = nsub.add_parser("validate", help="run the check suite; resume the node only if every check passes")
    v.add_argument("name")
    hi = nsub.add_parser("history", help="the node's incidents: evidence, every step, the return to service")
    hi.add_argument("name")
    hi.add_argument("--url", help=f"the engine (default: from --config, else {DEFAULT_URL})")
    hi.add_argument("--token-file", type=Path, help="the engine's token (default: $WATCHD_TOKEN)")
    hi.add_argument("-c", "--config", type=Path, help="engine YAML config: the engine's address and token")
    hi.add_argument("--limit", type=int, default=20, help="incidents to show, newest first")
    hi.add_argument("--json", action="store_true", help="the raw document")
    ck = sub.add_parser(
        "checks", help="active checks: list them, run them on nodes, a node's history, the next round's order"
    )
    ck.add_argument("verb", choices=["list", "run", "history", "plan"])
    ck.add_argument("nodes", nargs="*", help="nodes (run, history)")
    ck.add_argument("--check", action="append", default=[], help="run only this check (repeatable)")
    ck.add_argument("--json", action="store_true", help="the raw documents")
    for parser in (v, ck):
        parser.add_argument("--url", help=f"the engine (default: from --config, else {DEFAULT_URL})")
        parser.add_argument("--token-file", type=Path, help="the engine's token (default: $WATCHD_TOKEN)")
        parser.add_argument("--by", help="who decides (default: your user name), recorded in the audit")
        parser.add_argument(
            "-c", "--config", type=Path, help="engine YAML config: the engine's address and token"
        )
        parser.add_argument("--timeout", type=float, default=3600.0, help="seconds to wait for the checks")

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
    rli.add_argument("--json", action="store_true", help="one JSON document")
    rt = rsub.add_parser("test", help="run rule unit tests (timelines of events and expected actions)")
    rt.add_argument("files", nargs="+", type=Path, help="test files")
    rsub.add_parser("schema", help="print the JSON Schema of rule files (for editors)")

    st = sub.add_parser("status", help="what the engine sees and did: incidents, held actions, breaker")
    st.add_argument("--url", default=DEFAULT_URL, help=f"the engine (default {DEFAULT_URL})")
    st.add_argument("--json", action="store_true", help="the raw status document")
    st.add_argument("--limit", type=int, help="nodes shown (troubled first; the engine's default: 500)")
    st.add_argument("--node", help="only this node, or the nodes with a prefix ending in '*'")

    ac = sub.add_parser("actions", help="list, release or discard actions the safety breaker held")
    ac.add_argument("verb", choices=["list", "release", "discard"])
    ac.add_argument("ids", nargs="*", type=int, help="held action ids (release, discard)")
    ac.add_argument("--url", default=DEFAULT_URL, help=f"the engine (default {DEFAULT_URL})")
    ac.add_argument("--token-file", type=Path, help="the engine's token (default: $WATCHD_TOKEN)")
    ac.add_argument("--by", help="who decides (default: your user name), recorded in the audit")

    # issue 17: reliability accounting and checkpoint advice
    rb = sub.add_parser("reliability", help="failures, MTBF with its interval, lemons, checkpoint advice")
    rb.add_argument("--url", default=DEFAULT_URL, help=f"the engine (default {DEFAULT_URL})")
    rb.add_argument("--partition", help="only this partition's nodes")
    rb.add_argument("--since", help="window start: epoch seconds or a duration back (30d, 12h; default 90d)")
    rb.add_argument("--job", help="the checkpoint advice for one running job")
    rb.add_argument("--json", action="store_true", help="the raw document")
    dr = sub.add_parser("drains", help="every node out of service in the fleet, who took it out and why")
    dr.add_argument("--url", default=DEFAULT_URL, help=f"engine URL (default {DEFAULT_URL})")
    dr.add_argument("--json", action="store_true", help="the engine's document as JSON")
    dr.add_argument("--refresh", action="store_true", help="list the fleet now, not the last poll")
    dr.add_argument("--owner", choices=("watchd", "nhc", "scheduler", "admin", "other"), help="only these")
    # issue 18: per-team usage, queue waits, energy, lost GPU-hours (docs/reports.md)
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

    sub.add_parser("version", help="print the version")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    try:
        try:
            return _main(argv)
        finally:
            sys.stdout.flush()  # a reader that went away shows here, not as a traceback at exit
    except BrokenPipeError:
        if not _reader_gone(sys.stdout):
            raise
        # as Unix tools do (`watchd checks history NODE | head -3`): stop quietly, with the status a
        # process killed by SIGPIPE has in the shell; the output still buffered goes nowhere
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return 128 + signal.SIGPIPE


def _reader_gone(stream: TextIO) -> bool:
    """Whether the reading end of this output is closed (a pipe whose reader exited polls POLLERR)."""
    try:
        fd = stream.fileno()
    except (OSError, ValueError):
        return False
    poller = select.poll()
    poller.register(fd, select.POLLOUT)
    return any(events & (select.POLLERR | select.POLLHUP) for _, events in poller.poll(0))


def _main(argv: Sequence[str] | None) -> int:
    args = _parser().parse_args(argv)
    try:
        return _dispatch(args)
    except UsageError as exc:
        # under systemd, an error the journal files as one (journalctl -p err), as the daemons' log lines
        priority = "<3>" if writes_to_journal(sys.stderr) else ""
        print(f"{priority}watchd {args.command}: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


def _dispatch(args: argparse.Namespace) -> int:
    if args.command == "version":
        print(f"watchd {__version__}")
        return 0
    if args.command == "xid":
        from watchd.xid.render import run_xid

        return run_xid(args.files, args.json, sys.stdin, sys.stdout)
    if args.command == "heartbeat-token":
        from watchd.agent.heartbeat_auth import job_token

        secret = load_config(AgentConfig, args.config).heartbeat.token_secret.resolve(
            "heartbeat.token_secret"
        )
        if secret is None:
            raise UsageError("heartbeat.token_secret is not set in the agent's config")
        print(job_token(secret.encode(), args.job))
        return 0
    if args.command == "engine":
        return _run_engine(args.config, args.check, args.log_level)
    if args.command == "agent":
        return _run_agent(args.config, args.check, args.log_level)
    if args.command == "demo":
        from watchd.sim.demo import run_demo

        if not 1 <= args.nodes <= 1000:
            raise UsageError("--nodes must be between 1 and 1000")
        return asyncio.run(run_demo(args.nodes, sys.stdout))
    if args.command == "sim":
        from watchd.sim.command import run_sim

        return run_sim(
            args.fleet,
            args.url,
            args.token_file,
            args.duration,
            args.progress,
            args.check,
            args.log_level,
            sys.stdout,
        )
    if args.command == "node" and args.node_command == "validate":
        from watchd.checks_cli import run_validate

        return run_validate(
            args.name, args.url, args.token_file, args.config, args.by, args.timeout, sys.stdout
        )
    if args.command == "checks":
        from watchd.checks_cli import run_checks

        return run_checks(
            args.verb,
            args.nodes,
            args.check,
            args.url,
            args.token_file,
            args.config,
            args.by,
            args.json,
            args.timeout,
            sys.stdout,
        )
    if args.command == "node" and args.node_command == "history":
        from watchd.operator_cli import run_history

        return run_history(
            args.name, args.url, args.token_file, args.config, args.limit, args.json, sys.stdout
        )
    if args.command == "node":
        from watchd.operator_cli import run_resume

        return run_resume(args.name, args.url, args.token_file, args.by, args.config, sys.stdout)
    if args.command == "rules":
        from watchd.rules import commands

        if args.rules_command in ("check", "list"):
            paths, defaults = _rule_paths(args.paths, args.config, args.no_defaults)
            if args.rules_command == "check":
                return commands.run_check(paths, sys.stdout, defaults=defaults)
            return commands.run_list(paths, sys.stdout, defaults=defaults, as_json=args.json)
        if args.rules_command == "test":
            return commands.run_test(args.files, sys.stdout)
        return commands.run_schema(sys.stdout)
    if args.command == "status":
        from watchd.operator_cli import run_status

        return run_status(args.url, args.json, sys.stdout, limit=args.limit, node=args.node)
    if args.command == "drains":
        from watchd.drains_cli import run_drains

        return run_drains(args.url, args.json, args.refresh, args.owner, sys.stdout)
    if args.command == "actions":
        from watchd.operator_cli import run_actions

        return run_actions(args.verb, args.ids, args.url, args.token_file, args.by, sys.stdout)
    if args.command == "reliability":
        from watchd.reliability_cli import run_reliability

        return run_reliability(
            args.url, args.json, sys.stdout, partition=args.partition, since=args.since, job=args.job
        )
    if args.command == "report":
        from watchd.reports.command import run_usage

        engine = load_config(EngineConfig, args.config) if args.config is not None else None
        return run_usage(
            since=args.since,
            until=args.until,
            by=args.by,
            fmt=args.format,
            source=args.source,
            fixture=args.fixture,
            state=args.state or (engine.state.path if engine is not None else None),
            cfg=engine.reports if engine is not None else None,
            idle_util_pct=args.idle_threshold,
            output=args.output,
            out=sys.stdout,
            err=sys.stderr,
            slurm_conf=engine.slurm.slurm_conf if engine is not None else None,
            squeue=engine.slurm.squeue if engine is not None else "squeue",
        )
    raise AssertionError(args.command)


def _rule_paths(paths: list[Path], config: Path | None, no_defaults: bool) -> tuple[list[Path], bool]:
    """The rule files and whether the defaults load with them: from the command line, or the engine's
    config (its ``rules`` and ``default_rules``)."""
    if config is None:
        return paths, not no_defaults
    if paths:
        raise UsageError("give rule paths or --config, not both")
    engine = load_config(EngineConfig, config)
    return list(engine.rules), engine.default_rules and not no_defaults


def _run_engine(path: Path | None, check: bool, log_level: str | None = None) -> int:
    from watchd.engine.runner import Engine
    from watchd.rules import load_rules

    config = load_config(EngineConfig, path)
    if check:  # validate everything that can be validated without changing anything
        rules = load_rules(config.rules, defaults=config.default_rules)
        config.auth.resolve()
        if config.checks.enabled and config.checks.runner == "slurm":
            from watchd.integrations.slurm.output_dir import check_output_dir, engine_uid

            uid = engine_uid(config.checks.slurm.user)
            found = check_output_dir(config.checks.output_dir, create=False, uid=uid)  # ConfigError: unsafe
            print(f"checks.output_dir: {config.checks.output_dir}: {found}")
        print(f"ok: mode {config.mode}, {len(rules.rules)} rules ({', '.join(rules.names)})")
        return asyncio.run(_check_scheduler(config))
    log = config.log
    configure_logging(log_level or log.level, log.format, syslog_priority=log.syslog_priority)
    engine = Engine(config)

    async def run() -> None:
        async with engine:  # loads the rules, the token and the state: errors surface before READY=1
            await _serve_until_signalled(reload=engine.reload_rules)

    asyncio.run(run())
    return 0


async def _check_scheduler(config: EngineConfig) -> int:
    """Whether the configured scheduler lets the engine act: 1 when it refuses and the engine enforces."""
    from watchd.engine.privileges import privileges
    from watchd.integrations.registry import build_scheduler

    scheduler = build_scheduler(config)
    if scheduler is None:
        print("no scheduler: the engine decides and alerts, and changes no node")
        return 0
    try:
        answer = await privileges(scheduler)
    finally:
        aclose = getattr(scheduler, "aclose", None)
        if aclose is not None:
            await aclose()
    verdict = {True: "may act", False: "REFUSED", None: "unknown"}[answer.allowed]
    print(f"{scheduler.name}: {verdict}: {answer.detail}")
    return 1 if answer.allowed is False and config.mode == "enforce" else 0


def _run_agent(path: Path | None, check: bool, log_level: str | None = None) -> int:
    from watchd.agent.runner import Agent

    config = load_config(AgentConfig, path)
    config.engine.auth.resolve("engine.auth")
    if config.heartbeat.socket_group is not None:
        from watchd.agent.heartbeat_server import socket_group_id

        try:
            socket_group_id(config.heartbeat.socket_group)
        except OSError as exc:
            raise ConfigError(f"{path}: {exc}") from None
    if check:
        print(f"ok: node {config.node}, engine {config.engine.url}")
        return 0
    log = config.log
    configure_logging(log_level or log.level, log.format, syslog_priority=log.syslog_priority)

    async def run() -> None:
        async with Agent(config):
            await _serve_until_signalled()

    asyncio.run(run())
    return 0


async def _serve_until_signalled(reload: Callable[[], object] | None = None) -> None:
    """Signals only trigger shutdown (or reload); the caller's context managers do the teardown."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    if reload is not None:
        loop.add_signal_handler(signal.SIGHUP, reload)
    notify("READY=1")
    pinger = asyncio.create_task(watchdog_pinger())
    try:
        await stop.wait()
    finally:
        notify("STOPPING=1")
        pinger.cancel()
