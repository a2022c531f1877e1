"""The ``watchd`` command line (its grammar: :mod:`watchd.cli_parser`). An error is one line on stderr,
never a traceback, and an exit status that says what kind it was (:mod:`watchd.errors`, docs/cli.md)."""

from __future__ import annotations

import argparse
import asyncio
import os
import select
import signal
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from watchd import __version__
from watchd.cli_parser import parser
from watchd.config import AgentConfig, EngineConfig, load_config
from watchd.credentials import inline_secret_hint, readable_inline_secrets, warn_inline_secrets
from watchd.errors import ConfigError, UsageError
from watchd.logs import configure_logging, writes_to_journal
from watchd.reach import Settings, client_for, resolve
from watchd.systemd import notify, watchdog_pinger

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry


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
    args = parser().parse_args(argv)
    try:
        return _dispatch(args)
    except UsageError as exc:
        # under systemd, an error the journal files as one (journalctl -p err), as the daemons' log lines
        priority = "<3>" if writes_to_journal(sys.stderr) else ""
        print(f"{priority}watchd {args.command}: {exc}", file=sys.stderr)
        return exc.exit_code
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

        target = resolve(Settings(url=args.url, token_file=args.token_file))
        return run_sim(
            args.fleet,
            target.url,
            target.token,
            args.duration,
            args.progress,
            args.check,
            args.log_level,
            sys.stdout,
        )
    if args.command == "completion":
        from watchd.completion import script

        sys.stdout.write(script(args.shell, parser()))
        return 0
    if args.command == "rules":
        return _rules(args)
    return _operate(args)


def _operate(args: argparse.Namespace) -> int:
    """The commands that talk to a running engine."""
    if args.command == "report":
        return _report(args)
    client = client_for(args, sys.stderr)
    out = sys.stdout
    if args.command == "node" and args.node_command == "validate":
        from watchd.checks_cli import run_validate

        return run_validate(args.name, client, args.timeout, args.json, out)
    if args.command == "checks":
        from watchd.checks_cli import run_checks

        return run_checks(args.verb, args.nodes, args.check, client, args.json, args.timeout, out)
    if args.command == "node" and args.node_command == "unmark":
        from watchd.operator_cli import run_unmark

        return run_unmark(args.name, args.why, args.mark or "", client, args.json, out)
    if args.command == "node" and args.node_command == "marks":
        from watchd.operator_cli import run_marks

        return run_marks(args.name, client, args.json, out)
    if args.command == "node" and args.node_command == "history":
        from watchd.operator_cli import run_history

        return run_history(args.name, client, args.limit, args.json, out)
    if args.command == "node":
        from watchd.operator_cli import run_resume

        return run_resume(args.name, client, args.json, out)
    if args.command == "status":
        from watchd.operator_cli import run_status

        return run_status(client, args.json, out, limit=args.limit, node=args.node)
    if args.command == "drains":
        from watchd.drains_cli import run_drains

        return run_drains(client, args.json, args.refresh, args.owner, out)
    if args.command == "actions":
        from watchd.operator_cli import run_actions

        return run_actions(args.verb, args.ids, client, args.json, out)
    if args.command == "reliability":
        from watchd.reliability_cli import run_reliability

        return run_reliability(
            client, args.json, out, partition=args.partition, since=args.since, job=args.job
        )
    raise AssertionError(args.command)


def _rules(args: argparse.Namespace) -> int:
    from watchd.rules import commands

    if args.rules_command in ("check", "list"):
        paths, defaults = _rule_paths(args.paths, args.config, args.no_defaults)
        if args.rules_command == "check":
            return commands.run_check(paths, sys.stdout, defaults=defaults, as_json=args.json)
        return commands.run_list(paths, sys.stdout, defaults=defaults, as_json=args.json)
    if args.rules_command == "test":
        return commands.run_test(args.paths, sys.stdout, as_json=args.json, junit=args.junit)
    return commands.run_schema(sys.stdout)


def _report(args: argparse.Namespace) -> int:
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
    inline, mode = readable_inline_secrets(config, path)
    if check:  # what the start checks before it opens anything (the same function), and the rules
        from watchd.engine.preflight import preflight

        _print_inline_secrets(path, inline, mode)
        checked = preflight(config)
        rules = load_rules(config.rules, defaults=config.default_rules)
        for note in checked.notes:
            print(note)
        print(f"ok: mode {config.mode}, {len(rules.rules)} rules ({', '.join(rules.names)})")
        return asyncio.run(_check_scheduler(config))
    log = config.log
    configure_logging(log_level or log.level, log.format, syslog_priority=log.syslog_priority)
    engine = Engine(config)
    _inline_secrets_at_start(engine.metrics.registry, path, inline, mode)

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
    inline, mode = readable_inline_secrets(config, path)
    try:
        agent = Agent(config)  # builds everything, opens nothing: what the start checks, --check checks
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}" if path is not None else str(exc)) from None
    if check:
        if config.heartbeat.socket_group is not None:  # at start: the endpoint is down, logged, not fatal
            from watchd.agent.heartbeat_server import socket_group_id

            try:
                socket_group_id(config.heartbeat.socket_group)
            except OSError as exc:  # it names the key
                raise ConfigError(f"{path}: {exc}") from None
        _print_inline_secrets(path, inline, mode)
        print(f"ok: node {config.node}, engine {config.engine.url}")
        return 0
    log = config.log
    configure_logging(log_level or log.level, log.format, syslog_priority=log.syslog_priority)
    _inline_secrets_at_start(agent.metrics.registry, path, inline, mode)

    async def run() -> None:
        async with agent:
            await _serve_until_signalled()

    asyncio.run(run())
    return 0


def _print_inline_secrets(path: Path | None, keys: list[str], mode: int) -> None:
    """``--check``: a warning line per secret held inline in a config others may read (not an error)."""
    if path is not None:
        for key in keys:
            print(f"warning: {inline_secret_hint(path, key, mode)}", file=sys.stderr)


def _inline_secrets_at_start(
    registry: CollectorRegistry, path: Path | None, keys: list[str], mode: int
) -> None:
    """At start: the same warnings, logged, and ``watchd_config_inline_secrets``."""
    from watchd.security import inline_secrets_metric

    if path is not None:
        warn_inline_secrets(path, keys, mode)
    inline_secrets_metric(registry, len(keys))


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
