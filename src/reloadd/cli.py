"""``reloadd`` command line: run, check, plan, reload, status.

The only place that configures logging, installs default signal handlers and exits.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
import json
import logging
import signal
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from ._config import Config, load_config
from ._errors import ReloaddError
from ._logging import configure_logging
from ._ops._pidfile import remove_pid_file, signal_pid_file, write_pid_file
from ._ops._services import services
from ._ops._terminal import confirm_prune, query_status, send_reload
from ._pipeline._building import build_consumer
from ._pipeline._plan import plan
from ._reloader import Reloader

__all__ = ["main"]

log = logging.getLogger("reloadd")


_DESCRIPTION = """\
reloadd keeps a Kubernetes node in step with files on its disk, the moment they change: image
tarballs and lists are imported into containerd, registries.conf.d drop-ins become hosts.toml
files, and manifests are server-side applied (and pruned when their file goes)."""

_EPILOG = """\
examples:
  reloadd check  -c /etc/reloadd/reloadd.toml     validate the configuration
  reloadd run    -c /etc/reloadd/reloadd.toml     watch and act (SIGHUP: resync)
  reloadd status -c /etc/reloadd/reloadd.toml     what the running daemon is doing
  reloadd reload -c /etc/reloadd/reloadd.toml --confirm-prune   run held removals

'reloadd COMMAND --help' describes each command."""


def version() -> str:
    """The installed reloadd version (``unknown`` when run from a source tree without metadata)."""
    try:
        return importlib.metadata.version("reloadd")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="reloadd", description=_DESCRIPTION, epilog=_EPILOG,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--version", action="version", version=f"reloadd {version()}")
    ap.add_argument("--log-format", choices=("text", "json"), default="text",
                    help="log lines as text, or one JSON object per line for collectors")
    ap.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"),
                    help="the least severe level logged")
    sub = ap.add_subparsers(dest="command", required=True)
    for name, help_ in (
        ("run", "watch and act until stopped (SIGHUP: full resync, SIGTERM/SIGINT: graceful stop)"),
        ("check", "validate the configuration and every plugin's options, then exit"),
        ("plan", "print what every consumer's next pass would change, changing nothing "
                 "(exit 0: nothing, 2: something, 1: error)"),
        ("reload", "ask the running daemon for a full resync"),
        ("status", "print the running daemon's consumers, pending and failing paths"),
    ):
        p = sub.add_parser(name, help=help_)
        p.add_argument("--config", "-c", required=True, type=Path, help="the TOML configuration file")
        p.add_argument("--log-format", choices=("text", "json"), default=argparse.SUPPRESS,
                       help="as the global flag, given after the command")
        p.add_argument("--log-level", choices=("debug", "info", "warning", "error"), default=argparse.SUPPRESS,
                       help="as the global flag, given after the command")
        if name in ("status", "plan"):
            p.add_argument("--json", action="store_true", help="machine-readable output")
        if name == "reload":
            p.add_argument("--confirm-prune", action="store_true",
                           help="run the removals prune safety holds (see `reloadd status`) instead of a resync")
            p.add_argument("--consumer", help="with --confirm-prune: only this consumer's held removals")
    return ap


async def _run(cfg: Config) -> None:
    reloader = Reloader(cfg, install_signal_handlers=True)
    loop = asyncio.get_running_loop()
    previous = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    for sig in previous:
        loop.add_signal_handler(sig, reloader.stop)
    try:
        async with services(reloader):
            await reloader.start()
            if cfg.pid_file:  # only now: a SIGHUP before the handler exists would kill us
                write_pid_file(cfg.pid_file)
            log.info("reloadd watching %d consumer(s)", len(cfg.consumers))
            await reloader.serve()
    finally:
        for sig, handler in previous.items():
            loop.remove_signal_handler(sig)
            signal.signal(sig, handler)
        if cfg.pid_file:
            remove_pid_file(cfg.pid_file)


def _check(cfg: Config) -> list[str]:
    if cfg.state_dir is None:  # state in memory: give the factories a throw-away directory
        with tempfile.TemporaryDirectory(prefix="reloadd-check-") as tmp:
            return _check_in(cfg, Path(tmp))
    return _check_in(cfg, cfg.state_dir / "check")


def _check_in(cfg: Config, state_dir: Path) -> list[str]:
    problems: list[str] = []
    for cc in cfg.consumers:
        try:  # the very path `run` takes, so both word a plugin's option errors alike
            build_consumer(cc, {}, state_dir, cfg.source)
        except ReloaddError as exc:
            problems.append(str(exc))
        except Exception as exc:
            problems.append(f"consumer {cc.name!r}: {type(exc).__name__}: {exc}")
    return problems


def _plan(cfg: Config, as_json: bool) -> int:
    try:
        report = asyncio.run(plan(cfg))
    except ReloaddError as exc:
        print(f"reloadd: {exc}", file=sys.stderr)
        return 1
    if as_json:
        print(json.dumps({"version": version(), **report.to_json()}, indent=2))
    else:
        print(report.text())
    for c in report.consumers:
        if c.error is not None:
            print(f"reloadd: consumer {c.name!r}: failed to plan: {c.error}", file=sys.stderr)
    return report.exit_code


def _reload(cfg: Config) -> int:
    if send_reload(cfg):
        print(f"reloadd: asked the daemon on {cfg.control_socket} for a full resync")
        return 0
    if cfg.pid_file is None:
        print("reloadd: no pid_file configured under [reloadd]; cannot find the daemon", file=sys.stderr)
        return 1
    try:
        pid = signal_pid_file(cfg.pid_file, signal.SIGHUP)
    except ReloaddError as exc:
        print(f"reloadd: cannot signal the daemon: {exc}", file=sys.stderr)
        return 1
    print(f"reloadd: asked pid {pid} for a full resync")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``reloadd`` console script."""
    args = _parser().parse_args(argv)
    configure_logging(args.log_format, args.log_level)
    try:
        cfg = load_config(args.config)
    except ReloaddError as exc:
        print(f"reloadd: {exc}", file=sys.stderr)
        return 1 if args.command == "plan" else 2  # plan's 2 means "something would change"
    if args.command == "plan":
        return _plan(cfg, args.json)
    if args.command == "check":
        problems = _check(cfg)
        for p in problems:
            print(f"reloadd: {p}", file=sys.stderr)
        if not problems:
            print(f"reloadd: {args.config}: OK ({len(cfg.consumers)} consumer(s))")
        return 1 if problems else 0
    if args.command == "reload":
        if args.confirm_prune:
            return confirm_prune(cfg, args.consumer)
        return _reload(cfg)
    if args.command == "status":
        return query_status(cfg, as_json=args.json)
    from ._pipeline._memory import tune_gc, tune_malloc

    tune_malloc()  # this process is the daemon: fewer malloc arenas, large blocks mapped and unmapped whole
    tune_gc()  # and a burst's objects die young, not in the collector's oldest generation
    try:
        asyncio.run(_run(cfg))
    except ReloaddError as exc:
        log.error("%s", exc)
        return 1
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
