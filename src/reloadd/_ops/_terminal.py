"""The terminal side of ``reloadd status`` and ``reloadd reload``: ask the daemon, print what it says.

Only the CLI uses this module (it prints, and returns exit codes); the protocol and the server are
in :mod:`reloadd._ops._control`.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any, TextIO

from .._config import Config
from .._errors import ReloaddError
from ._control import request

__all__ = ["confirm_prune", "format_status", "query_status", "send_reload", "status_exit_code"]

log = logging.getLogger("reloadd.control")

_LIST_MAX = 10  # pending paths listed per consumer in the table
_HEALTH_LINES = 50  # files not current listed per consumer (a start-up pass may have thousands progressing)


def send_reload(cfg: Config) -> bool:
    """Ask the daemon for a full resync over the control socket.

    Returns:
        True when the daemon acknowledged; False when no control socket is configured
        or nothing answers on it (the caller then falls back to SIGHUP via ``pid_file``).
    """
    if cfg.control_socket is None or not cfg.control_socket.exists():
        return False
    try:
        request(cfg.control_socket, "reload")
    except (OSError, ReloaddError) as exc:
        log.debug("Control socket %s did not take the reload: %s", cfg.control_socket, exc)
        return False
    return True


def confirm_prune(cfg: Config, consumer: str | None = None) -> int:
    """Ask the daemon to run every held removal (or one consumer's); the exit code for ``reload --confirm-prune``.

    Only the control socket can carry it (a signal cannot say "confirm"): 1 when none is configured
    or nothing answers.
    """
    if cfg.control_socket is None:
        print("reloadd: --confirm-prune needs control_socket under [reloadd]; cannot reach the daemon",
              file=sys.stderr)
        return 1
    try:
        reply = request(cfg.control_socket, "confirm-prune", consumer=consumer)
    except (OSError, ReloaddError) as exc:
        print(f"reloadd: cannot reach the daemon on {cfg.control_socket}: {exc}", file=sys.stderr)
        return 1
    print(f"reloadd: the daemon is {reply.get('message', 'running the held removals')}")
    return 0


def query_status(cfg: Config, as_json: bool = False, out: TextIO | None = None) -> int:
    """Print the running daemon's status; the exit code for ``reloadd status``.

    Returns:
        0 when the daemon is ready and no path is failing, 3 when it answered but is
        not ready, has failing, rejected or prune-held paths, or a consumer whose state is not
        persisted (writes failing), 1 when it cannot be reached.
    """
    out = out or sys.stdout
    if cfg.control_socket is None:
        print("reloadd: no control_socket configured under [reloadd]; cannot reach the daemon",
              file=sys.stderr)
        return 1
    try:
        doc = request(cfg.control_socket, "status")["status"]
    except (OSError, ReloaddError, KeyError) as exc:
        print(f"reloadd: cannot reach the daemon on {cfg.control_socket}: {exc}", file=sys.stderr)
        return 1
    if as_json:
        json.dump(doc, out, indent=2, sort_keys=True)
        out.write("\n")
    else:
        out.write(format_status(doc))
    return status_exit_code(doc)


def status_exit_code(doc: dict[str, Any]) -> int:
    """``reloadd status``'s exit code for a status document: 0 all well, 3 something to look at.

    3 when the daemon is not ready, or a consumer has failing, rejected or prune-held paths, drift not
    restored, or state that is not persisted (its writes fail: a restart would hand over again what it
    acknowledged since).
    """
    consumers = doc.get("consumers", {}).values()
    troubled = any(c.get("failing") or c.get("rejected") or c.get("prune_held")
                   or not (c.get("state") or {}).get("persisted", True)
                   or any(not d.get("restored") for d in c.get("drift", [])) for c in consumers)
    return 0 if doc.get("ready") and not troubled else 3


def _ago(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.1f}h"


def _clock(ts: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(ts))


def _held_lines(lines: list[str], c: dict[str, Any], now: float) -> None:
    """``prune held: N objects of M path(s) (why, since when)``, one line per reason, then the paths."""
    held = c.get("prune_held") or []
    by_why: dict[str, list[dict[str, Any]]] = {}
    for h in held:
        by_why.setdefault(str(h.get("why")), []).append(h)
    unit = c.get("prune_held_unit", "files")
    for why, entries in by_why.items():
        size = sum(int(h.get("size", 0)) for h in entries)
        since = min(float(h.get("since", now)) for h in entries)
        lines.append(f"  PRUNE HELD: {size} {unit} of {len(entries)} path(s) ({why}, since {_clock(since)}, "
                     f"{_ago(now - since)} ago)")
        for h in entries[:_LIST_MAX]:
            lines.append(f"             {h['path']}")
        if len(entries) > _LIST_MAX:
            lines.append(f"             ... and {len(entries) - _LIST_MAX} more (--json lists all)")
    if held:
        lines.append("             run by `reloadd reload --confirm-prune`; the input coming back releases them")


def _drift_lines(lines: list[str], c: dict[str, Any], now: float) -> None:
    """``DRIFT:`` per drifted file (what moved, who moved it, a fight's corrections), ``drift:`` once restored."""
    detect = c.get("drift_mode") == "detect"
    for d in c.get("drift", []):
        by = f" by {d['by']}" if d.get("by") else ""
        head = "drift:    " if d.get("restored") else "DRIFT:    "
        state = ("restored" if d.get("restored") else "detect only: left as it is" if detect else "correcting")
        lines.append(f"  {head} {d.get('kind')} {d.get('what')}: {d.get('why')}{by} ({state}, since "
                     f"{_clock(float(d.get('since', now)))}, {_ago(now - float(d.get('since', now)))} ago)")
        lines.append(f"             declared by {d['path']}")
        if d.get("fighting"):
            nxt = d.get("next_correction_in")
            then = f"; next correction in {_ago(float(nxt))}" if nxt is not None else ""
            who = d.get("by") or "something"
            lines.append(f"             FIGHTING {who}: corrected {d.get('corrections')} times, "
                         f"{d.get('events')} drift events{then}")


def format_status(doc: dict[str, Any], now: float | None = None) -> str:
    """The human-readable status table."""
    now = time.time() if now is None else now
    lines = []
    up = _ago(now - doc["started_at"]) if doc.get("started_at") else "?"
    lines.append(
        f"reloadd {doc.get('version', '?')} (pid {doc.get('pid', '?')}, up {up}): "
        f"{'ready' if doc.get('ready') else 'NOT READY'}, watch {doc.get('watch', '?')}"
    )
    for problem in doc.get("ready_problems", []):
        lines.append(f"not ready: {problem}")
    if doc.get("metrics"):
        lines.append(f"metrics: {doc['metrics']}")
    for name, c in sorted(doc.get("consumers", {}).items()):
        last = c.get("last_success")
        last_s = f"{_ago(now - last)} ago" if last else "never"
        lines.append("")
        lines.append(f"consumer {name} ({c.get('plugin', '?')})")
        lines.append(f"  roots:     {', '.join(c.get('roots', [])) or '-'}")
        if c.get("note"):
            lines.append(f"  state:     {c['note']}")
        st = c.get("state") or {}
        if st.get("not_persisted"):
            lines.append(f"  {st['not_persisted']} ({st.get('write_errors', 0)} failed writes; "
                         f"it keeps delivering, retrying with backoff)")
        for aside in st.get("set_aside", []):
            where = f"moved aside to {aside['moved_to']}" if aside.get("moved_to") else "could not be moved aside"
            lines.append(f"  SET ASIDE: {aside['file']} ({aside.get('why')}): {where}; {aside.get('assumed')}")
        lines.append(
            f"  paths:     {c.get('records', 0)} known, {c.get('settling', 0)} settling, "
            f"{len(c.get('pending', []))} pending, {len(c.get('in_flight', []))} in flight, "
            f"{c.get('batches', 0)} batches, last success {last_s}"
        )
        for h in c.get("held", []):
            by = f" by pid {', '.join(map(str, h['writers']))}" if h.get("writers") else ""
            lines.append(f"  HELD:      {h['path']}: {h.get('why')}{by} for {_ago(float(h.get('held_for', 0)))} "
                         f"(others stopped waiting for it after max_delay; handed over at max_hold)")
        health = c.get("health")
        if health:
            objects = ", ".join(f"{n} {h}" for h, n in sorted(health.get("objects", {}).items()))
            lines.append(f"  health:    {objects or 'no objects'}")
            files = health.get("files", [])
            for f in files[:_HEALTH_LINES]:
                parts = [p for p in (f.get("object"), f.get("reason"), f.get("message")) if p]
                wave = f" (wave {f['wave']})" if f.get("wave") is not None else ""
                lines.append(f"  {f['state'].upper():<10} {f['path']}{wave} for {_ago(float(f.get('for', 0)))}"
                             + (f": {': '.join(parts)}" if parts else ""))
            if len(files) > _HEALTH_LINES:
                more = len(files) - _HEALTH_LINES
                lines.append(f"  ... {more} more not current (`reloadd status --json` lists them)")
        if c.get("oldest_pending_age"):
            lines.append(f"  waiting:   oldest for {_ago(c['oldest_pending_age'])}")
        if c.get("waiting_for"):
            lines.append(f"  after:     waits for {', '.join(c['waiting_for'])} to finish its work (`after`)")
        if c.get("held_groups"):
            lines.append(f"  group:     holding {'; '.join(c['held_groups'])} until every member settles")
        for p in c.get("in_flight", []):
            lines.append(f"  working:   {p}")
        failing = {f["path"] for f in c.get("failing", [])} | {d["path"] for d in c.get("deferred", [])}
        waiting = [p for p in c.get("pending", []) if p not in failing]
        for p in waiting[:_LIST_MAX]:
            lines.append(f"  pending:   {p}")
        if len(waiting) > _LIST_MAX:
            lines.append(f"  pending:   ... and {len(waiting) - _LIST_MAX} more (--json lists all)")
        for f in c.get("failing", []):
            at = f.get("next_retry_at")
            when = f"retry in {f.get('retry_in', 0):.1f}s" + (f" (at {_clock(at)})" if at else "")
            lines.append(f"  FAILING:   {f['path']}: attempt {f.get('attempts', '?')}, {when}")
            lines.append(f"             {f.get('error')}")
        for d in c.get("deferred", []):
            lines.append(f"  deferred:  {d['path']}: again in {d.get('retry_in', 0):.1f}s ({d.get('reason')})")
        _held_lines(lines, c, now)
        _drift_lines(lines, c, now)
        for rj in c.get("rejected", []):
            lines.append(f"  REJECTED:  {rj['path']} (not retried until it changes, or on SIGHUP / `reloadd reload`)")
            lines.append(f"             {rj.get('error')}")
    return "\n".join(lines) + "\n"
