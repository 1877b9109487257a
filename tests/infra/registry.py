"""Local ``docker-registry`` (distribution 2.x) instances on 127.0.0.1 for tests.

Example::

    async with local_registry(tmp_path) as reg:
        await push_image(archive, f"{reg.host}/library/hello:v1")
        assert any(r.path.startswith("/v2/library/hello/") for r in reg.requests())

containerd treats ``127.0.0.1:<port>`` as plain HTTP with no hosts.toml needed. Each
instance writes its access log (combined log format) to ``access.log`` in its directory.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import socket
import subprocess
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

__all__ = ["AccessLogEntry", "Registry", "RegistryError", "local_registries", "local_registry", "push_image"]

START_TIMEOUT = 20.0

_ACCESS = re.compile(r'^(\S+) \S+ \S+ \[[^\]]+\] "(\S+) (\S+) [^"]*" (\d{3}) (\S+)')


class RegistryError(RuntimeError):
    """A registry could not be started, or a push failed."""


@dataclass(frozen=True)
class AccessLogEntry:
    """One request the registry served."""

    method: str
    path: str
    status: int
    line: str


@dataclass
class Registry:
    """A running local registry.

    Attributes:
        host: ``127.0.0.1:<port>``, the registry host as used in image references.
        port: Its TCP port.
        dir: Its directory (config, storage, logs).
        access_log: Path of the access log.
    """

    host: str
    port: int
    dir: Path
    access_log: Path
    log_path: Path
    proc: asyncio.subprocess.Process | None = field(default=None, repr=False)

    @property
    def url(self) -> str:
        """``http://127.0.0.1:<port>``."""
        return f"http://{self.host}"

    def access_log_lines(self) -> list[str]:
        """Raw access-log lines so far."""
        try:
            text = self.access_log.read_text(errors="replace")
        except FileNotFoundError:
            return []
        return [ln for ln in text.splitlines() if _ACCESS.match(ln)]

    def requests(self) -> list[AccessLogEntry]:
        """Parsed access-log entries so far."""
        out = []
        for ln in self.access_log_lines():
            m = _ACCESS.match(ln)
            assert m is not None
            out.append(AccessLogEntry(m.group(2), m.group(3), int(m.group(4)), ln))
        return out

    def log_tail(self, n: int = 20) -> str:
        """Last lines of the registry's own (non-access) log."""
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    async def stop(self) -> None:
        """Stop the registry (it can not be restarted on the same port reliably)."""
        proc, self.proc = self.proc, None
        if proc is None or proc.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            proc.terminate()
        try:
            await asyncio.wait_for(proc.wait(), 10)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()


def _open_append(path: Path) -> BinaryIO:
    """Open a log file for a child process to append to."""
    return open(path, "ab")


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _start(d: Path, extra: Mapping[str, Any]) -> Registry:
    port = _free_port()
    config: dict[str, Any] = {
        "version": 0.1,
        "log": {"level": "info", "formatter": "text", "accesslog": {"disabled": False}},
        "storage": {"filesystem": {"rootdirectory": str(d / "storage")}, "delete": {"enabled": True}},
        "http": {"addr": f"127.0.0.1:{port}", "secret": "reloadd-tests"},
    }
    for k, v in extra.items():
        config[k] = {**config.get(k, {}), **v} if isinstance(v, dict) else v
    cfg = d / "config.yml"
    cfg.write_text(json.dumps(config, indent=2))  # JSON is YAML
    reg = Registry(host=f"127.0.0.1:{port}", port=port, dir=d, access_log=d / "access.log", log_path=d / "registry.log")
    with _open_append(reg.access_log) as out, _open_append(reg.log_path) as err:
        # distribution writes the access log to stdout and its own log to stderr.
        reg.proc = await asyncio.create_subprocess_exec(
            "docker-registry",
            "serve",
            str(cfg),
            stdout=out,
            stderr=err,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    loop = asyncio.get_running_loop()
    deadline = loop.time() + START_TIMEOUT
    delay = 0.02
    while loop.time() < deadline:
        if reg.proc.returncode is not None:
            raise RegistryError(f"docker-registry exited with {reg.proc.returncode}: {reg.log_tail()}")
        # Ready when it accepts connections (no HTTP request, so the access log stays clean).
        try:
            _, w = await asyncio.open_connection("127.0.0.1", port)
            w.close()
            await w.wait_closed()
            if "listening on" in reg.log_path.read_text(errors="replace"):
                return reg
        except OSError:
            pass
        await asyncio.sleep(delay)
        delay = min(delay * 1.5, 0.2)
    await reg.stop()
    raise RegistryError(f"docker-registry not ready after {START_TIMEOUT}s: {reg.log_tail()}")


@contextlib.asynccontextmanager
async def local_registry(
    tmp_path: Path, *, name: str = "registry", config: Mapping[str, Any] | None = None
) -> AsyncIterator[Registry]:
    """Start ``docker-registry`` on a free 127.0.0.1 port under ``tmp_path/<name>``.

    Args:
        tmp_path: Parent directory.
        name: Sub-directory name (unique per instance).
        config: Extra top-level config sections merged into the generated config
            (e.g. ``{"auth": {...}}`` or ``{"proxy": {"remoteurl": ...}}``).
    """
    d = (tmp_path / name).resolve()
    (d / "storage").mkdir(parents=True, exist_ok=True)
    reg: Registry | None = None
    for _attempt in range(3):  # another process may grab the free port in between
        try:
            reg = await _start(d, config or {})
            break
        except RegistryError as exc:
            if "address already in use" not in str(exc):
                raise
    if reg is None:
        raise RegistryError("docker-registry: no free port after 3 attempts")
    try:
        yield reg
    finally:
        await reg.stop()


@contextlib.asynccontextmanager
async def local_registries(tmp_path: Path, n: int) -> AsyncIterator[list[Registry]]:
    """Start ``n`` registries (``registry0`` … ``registry<n-1>``)."""
    async with contextlib.AsyncExitStack() as stack:
        regs = [await stack.enter_async_context(local_registry(tmp_path, name=f"registry{i}")) for i in range(n)]
        yield regs


async def push_image(
    source: Path | str,
    dest: str,
    *,
    transport: str | None = None,
    all_platforms: bool = True,
    source_image: str | None = None,
) -> None:
    """Copy an image into a registry with skopeo (plain HTTP, no TLS verification).

    Args:
        source: An OCI archive (``.tar``), an OCI layout directory or a docker archive.
        dest: ``host:port/repo:tag``.
        transport: skopeo source transport; guessed from ``source`` when omitted
            (directory → ``oci``, tar with ``oci-layout`` → ``oci-archive``, else ``docker-archive``).
        all_platforms: Copy every platform of an index (``--all``).
        source_image: Which image of a multi-image archive: for ``docker-archive`` a
            tag as written in it (``hello:v1``) or ``@<n>``; for ``oci-archive`` its
            ``org.opencontainers.image.ref.name``.
    """
    src = Path(source)
    if transport is None:
        transport = _guess_transport(src)
    args = ["skopeo", "copy", "--quiet", "--dest-tls-verify=false", "--insecure-policy"]
    if all_platforms:
        args.append("--all")
    src_ref = f"{transport}:{src}" + (f":{source_image}" if source_image else "")
    args += [src_ref, f"docker://{dest}"]
    proc = await asyncio.create_subprocess_exec(*args, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = await proc.communicate()
    if proc.returncode != 0:
        raise RegistryError(f"skopeo copy to {dest} failed: {err.decode()}{out.decode()}")


def _guess_transport(src: Path) -> str:
    if src.is_dir():
        return "oci"
    import tarfile

    with tarfile.open(src) as tf:
        names = set(tf.getnames())
    return "oci-archive" if "oci-layout" in names else "docker-archive"
