"""A private containerd for tests: own root, state, sockets and temp dir; CRI enabled.

Example::

    async with private_containerd(tmp_path, hosts_dir=tmp_path / "certs.d") as ctd:
        await ctd.ctr("images", "ls")
        await ctd.cri_pull("127.0.0.1:5000/library/hello:v1")

Three releases are supported, the ones nodes run today (``RELEASES``): Debian 12's own
``containerd`` package (1.6.x, on PATH), and trixie's (1.7.x) and sid's (2.x) binaries that
``scripts/infra/fetch-containerd.sh`` extracts into ``$RELOADD_CONTAINERD_CACHE``
(``/var/cache/reloadd/containerd``). ``RELOADD_CONTAINERD_RELEASES`` (comma-separated, default
all three) selects the matrix the tests run. Each release gets its own config format (version 2
for 1.x, version 3 for 2.x). Nothing of the system service is used. On exit the process is
stopped and every mount left under its directories (overlay snapshots, Diff.Apply temp mounts)
is unmounted.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from grpclib.const import Status
from grpclib.exceptions import GRPCError

__all__ = [
    "RELEASES",
    "Containerd",
    "ContainerdError",
    "NodeCri",
    "Release",
    "containerd_config",
    "get_release",
    "private_containerd",
    "releases_under_test",
    "unmount_under",
]

START_TIMEOUT = 30.0
STOP_TIMEOUT = 10.0
CRI_ATTEMPTS = 5


class ContainerdError(RuntimeError):
    """The private containerd could not be started or a helper command failed."""


@dataclass(frozen=True)
class Release:
    """One containerd release line and where its binaries are.

    Attributes:
        name: ``"1.6"``, ``"1.7"`` or ``"2.x"`` (the test ids).
        suite: The Debian suite it comes from.
        bin_dir: Directory holding containerd, ctr and the shim; None means PATH (Debian 12's package).
        config_version: The config.toml ``version`` this release reads natively.
    """

    name: str
    suite: str
    bin_dir: Path | None
    config_version: int

    def binary(self, name: str) -> str:
        """The path (or PATH name) of one of the release's binaries."""
        return name if self.bin_dir is None else str(self.bin_dir / name)

    def check(self) -> None:
        """Raise ContainerdError naming the fix when the binaries are not there."""
        if self.bin_dir is None:
            if shutil.which("containerd") is None:
                raise ContainerdError("containerd is not installed: run `make deps`")
        elif not (self.bin_dir / "containerd").exists():
            raise ContainerdError(
                f"containerd {self.name} ({self.suite}) is not in {self.bin_dir}: run `make containerd-releases`"
            )


CACHE = Path(os.environ.get("RELOADD_CONTAINERD_CACHE", "/var/cache/reloadd/containerd"))
RELEASES: dict[str, Release] = {
    "1.6": Release("1.6", "bookworm", None, 2),
    "1.7": Release("1.7", "trixie", CACHE / "trixie" / "bin", 2),
    "2.x": Release("2.x", "sid", CACHE / "sid" / "bin", 3),
}


def get_release(name: str) -> Release:
    """The Release called ``name`` (``1.6``, ``1.7``, ``2.x``)."""
    try:
        return RELEASES[name]
    except KeyError:
        raise ContainerdError(f"unknown containerd release {name!r}; known: {', '.join(RELEASES)}") from None


def releases_under_test() -> list[str]:
    """The releases the matrix tests run (``RELOADD_CONTAINERD_RELEASES``, default all)."""
    raw = os.environ.get("RELOADD_CONTAINERD_RELEASES", "")
    names = [n.strip() for n in raw.split(",") if n.strip()] or list(RELEASES)
    for n in names:
        get_release(n)
    return names


class _CriMissing(Exception):
    """containerd serves gRPC but its CRI plugin did not load."""


@dataclass(frozen=True)
class NodeCri:
    """The CRI settings that make a private containerd the runtime of a real kubelet (docs/testbed.md).

    Attributes:
        sandbox_image: Every pod's sandbox image; it must be imported beforehand (nothing can be pulled).
        cni_conf_dir: A private CNI config dir (a bridge + host-local conflist).
        cni_bin_dir: The CNI plugins (Debian's ``containernetworking-plugins``).
        runc_root: runc's state dir for the CRI's containers (private, not the system's ``/run/containerd/runc``).

    Beyond these, the CRI section then has ``restrict_oom_score_adj = true``: on these machines no process,
    root included, may lower its ``oom_score_adj``, and the CRI plugin gives every sandbox -998, so runc
    fails (``can't get final child's PID from pipe``) unless the value is clamped to containerd's own.
    """

    sandbox_image: str
    cni_conf_dir: Path
    runc_root: Path
    cni_bin_dir: Path = Path("/usr/lib/cni")


def containerd_config(
    d: Path,
    root: Path,
    state: Path,
    address: str,
    *,
    hosts_dir: Path | None = None,
    snapshotter: str = "overlayfs",
    version: int = 2,
    node: NodeCri | None = None,
) -> str:
    """The config.toml of a private containerd in ``d`` (what :func:`private_containerd` writes).

    Args:
        node: CRI settings for a kubelet; only for config version 2 (containerd 1.6 and 1.7: the 1.20
            kubelet speaks CRI v1alpha2, which 2.x dropped).
    """
    if node is not None and version >= 3:
        raise ContainerdError("a kubelet 1.20 speaks CRI v1alpha2, which containerd 2.x dropped: use 1.6 or 1.7")
    head = f"""version = {version}
root = "{root}"
state = "{state}"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
                    "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs"]
[grpc]
  address = "{address}"
[ttrpc]
  address = "{address}.ttrpc"
[debug]
  level = "info"
[metrics]
  address = ""
[plugins]
  [plugins."io.containerd.internal.v1.opt"]
    path = "{d}/opt"
  [plugins."io.containerd.grpc.v1.cri"]
    disable_tcp_service = true
    stream_server_address = "127.0.0.1"
    stream_server_port = "0"
"""
    hosts = f'config_path = "{hosts_dir}"' if hosts_dir is not None else ""
    if version >= 3:  # containerd 2.x: CRI split into images / runtime plugins
        return head + f"""  [plugins."io.containerd.cri.v1.runtime"]
    disable_apparmor = true
    [plugins."io.containerd.cri.v1.runtime".cni]
      bin_dirs = ["{d}/cni/bin"]
      conf_dir = "{d}/cni/conf"
  [plugins."io.containerd.cri.v1.images"]
    snapshotter = "{snapshotter}"
    [plugins."io.containerd.cri.v1.images".registry]
      {hosts}
"""
    # version 2 (1.6, 1.7): everything CRI under io.containerd.grpc.v1.cri, continued here
    if node is None:
        return head + f"""    disable_apparmor = true
    [plugins."io.containerd.grpc.v1.cri".cni]
      bin_dir = "{d}/cni/bin"
      conf_dir = "{d}/cni/conf"
    [plugins."io.containerd.grpc.v1.cri".containerd]
      snapshotter = "{snapshotter}"
    [plugins."io.containerd.grpc.v1.cri".registry]
      {hosts}
"""
    return head + f"""    disable_apparmor = true
    restrict_oom_score_adj = true
    sandbox_image = "{node.sandbox_image}"
    [plugins."io.containerd.grpc.v1.cri".cni]
      bin_dir = "{node.cni_bin_dir}"
      conf_dir = "{node.cni_conf_dir}"
    [plugins."io.containerd.grpc.v1.cri".containerd]
      snapshotter = "{snapshotter}"
      default_runtime_name = "runc"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
        runtime_type = "io.containerd.runc.v2"
        [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
          Root = "{node.runc_root}"
    [plugins."io.containerd.grpc.v1.cri".registry]
      {hosts}
"""


def _open_append(path: Path) -> BinaryIO:
    """Open a log file for a child process to append to."""
    return open(path, "ab")


def _mounts_under(*dirs: Path) -> list[str]:
    prefixes = [str(d.resolve()) for d in dirs]
    out: list[str] = []
    with open("/proc/self/mountinfo", encoding="utf-8") as f:
        for line in f:
            point = line.split()[4].replace("\\040", " ")
            if any(point == p or point.startswith(p + "/") for p in prefixes):
                out.append(point)
    return out


def unmount_under(*dirs: Path) -> None:
    """Lazily unmount every mount point below ``dirs`` (deepest first)."""
    for point in sorted(_mounts_under(*dirs), key=len, reverse=True):
        subprocess.run(["umount", "-l", point], check=False, capture_output=True)


@dataclass
class Containerd:
    """A running private containerd.

    Attributes:
        dir: Its directory (config, root, state, log).
        address: The gRPC unix socket path (short, under /tmp).
        root: containerd's ``root`` (content store, metadata, snapshots).
        state: containerd's ``state``.
        hosts_dir: The CRI registry ``config_path`` (``certs.d``-style), if any.
        log_path: containerd's combined stdout/stderr.
    """

    dir: Path
    address: str
    root: Path
    state: Path
    tmp: Path
    hosts_dir: Path | None
    log_path: Path
    config_path: Path
    release: Release = field(default_factory=lambda: RELEASES["1.6"])
    proc: asyncio.subprocess.Process | None = field(default=None, repr=False)

    async def start(self) -> None:
        """Start the daemon (again) and wait until its gRPC and CRI services answer.

        containerd skips its CRI plugin when that fails to initialise — on a busy machine
        typically because the per-user inotify instance limit (CRI watches its CNI config dir)
        is exhausted for a moment. Such a start is retried with backoff (about 15 s in all).
        """
        if self.proc is not None and self.proc.returncode is None:
            raise ContainerdError("containerd is already running")
        for attempt in range(CRI_ATTEMPTS):
            try:
                await self._start_once()
                return
            except _CriMissing as exc:
                await self.stop()
                if attempt == CRI_ATTEMPTS - 1:
                    raise ContainerdError(str(exc)) from exc
                await asyncio.sleep(0.5 * 2**attempt)  # let a burst of inotify users pass

    async def _start_once(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.address)
        env = dict(os.environ, TMPDIR=str(self.tmp))
        if self.release.bin_dir is not None:  # its own shim first on PATH
            env["PATH"] = f"{self.release.bin_dir}{os.pathsep}{env.get('PATH', '')}"
        log = _open_append(self.log_path)
        try:
            self.proc = await asyncio.create_subprocess_exec(
                self.release.binary("containerd"),
                "--config",
                str(self.config_path),
                stdout=log,
                stderr=log,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,
            )
        finally:
            log.close()
        await self._wait_ready()

    async def _wait_ready(self) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + START_TIMEOUT
        delay = 0.02
        last = ""
        while loop.time() < deadline:
            assert self.proc is not None
            if self.proc.returncode is not None:
                raise ContainerdError(f"containerd exited with {self.proc.returncode}: {self.log_tail()}")
            if os.path.exists(self.address):  # noqa: ASYNC240 - a stat of a local socket, never blocks long
                try:
                    await self.cri_list_images()
                    return
                except GRPCError as exc:
                    if exc.status == Status.UNIMPLEMENTED:  # serving, but without the CRI plugin
                        raise _CriMissing(f"containerd started without CRI:\n{self.log_problems()}") from exc
                    last = str(exc)
                except Exception as exc:
                    last = str(exc)
            await asyncio.sleep(delay)
            delay = min(delay * 1.5, 0.25)
        raise ContainerdError(
            f"containerd not ready after {START_TIMEOUT}s ({last}); problems logged:\n{self.log_problems()}\n"
            f"log tail:\n{self.log_tail(10)}"
        )

    async def stop(self, sig: int = signal.SIGTERM) -> None:
        """Stop the daemon with ``sig`` (SIGKILL to simulate a crash) and wait for it."""
        proc, self.proc = self.proc, None
        if proc is None or proc.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(sig)
        try:
            await asyncio.wait_for(proc.wait(), STOP_TIMEOUT)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()

    async def kill(self) -> None:
        """SIGKILL the daemon (a crash: no cleanup on its side)."""
        await self.stop(signal.SIGKILL)

    async def restart(self) -> None:
        """Stop gracefully and start again on the same root."""
        await self.stop()
        await self.start()

    @property
    def running(self) -> bool:
        """Whether the daemon process is alive."""
        return self.proc is not None and self.proc.returncode is None

    def log_tail(self, n: int = 30) -> str:
        """The last ``n`` lines of containerd's log."""
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def panics(self) -> list[str]:
        """Lines of the log that show the daemon panicked (Go ``panic:`` or a fatal runtime error).

        Not counted: containerd 1.6's own shutdown bug, where a garbage collection cut short by the stop
        (``garbage collection failed ... context canceled``) is followed by a nil dereference in
        ``gcScheduler.run`` (it reads the failed run's stats); a test that stops containerd right after
        an image change can meet it, whatever the client did.
        """
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return []
        out = []
        for i, ln in enumerate(lines):
            if not ln.startswith(("panic:", "fatal error:", "SIGSEGV", "runtime error:")):
                continue
            before, after = lines[max(0, i - 1)], "\n".join(lines[i + 1:i + 6])
            if ('garbage collection failed" error="context canceled"' in before
                    and "gc/scheduler.(*gcScheduler).run" in after):
                continue
            out.append(ln)
        return out

    def log_problems(self, n: int = 20) -> str:
        """The last ``n`` warning/error lines of containerd's log (CNI noise left out)."""
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        bad = [
            ln
            for ln in lines
            if ("level=error" in ln or "level=warn" in ln or "level=fatal" in ln)
            and "failed to load cni during init" not in ln  # expected: no CNI config in tests
        ]
        return "\n".join(bad[-n:])

    async def ctr(self, *args: str, namespace: str = "k8s.io", stdin: bytes | None = None, check: bool = True) -> str:
        """Run ``ctr -a <socket> -n <namespace> args...`` and return its stdout."""
        proc = await asyncio.create_subprocess_exec(
            self.release.binary("ctr"),
            "-a",
            self.address,
            "-n",
            namespace,
            *args,
            stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        out, err = await proc.communicate(stdin)
        if check and proc.returncode != 0:
            raise ContainerdError(f"ctr {' '.join(args)} failed ({proc.returncode}): {err.decode()}")
        return out.decode()

    # -- CRI runtime.v1 ImageService (namespace k8s.io) ----------------------------------------
    async def cri_pull(self, ref: str, timeout: float = 120.0) -> str:
        """CRI PullImage; returns the image id (``sha256:<config>``)."""
        from reloadd_containerd_images._proto.cri.runtime.v1 import api_pb2 as pb

        async with self._cri() as stub:
            resp = await stub.PullImage(pb.PullImageRequest(image=pb.ImageSpec(image=ref)), timeout=timeout)
        return str(resp.image_ref)

    async def cri_image_status(self, ref: str) -> Any | None:
        """CRI ImageStatus: the ``runtime.v1.Image`` message, or None when absent."""
        from reloadd_containerd_images._proto.cri.runtime.v1 import api_pb2 as pb

        async with self._cri() as stub:
            resp = await stub.ImageStatus(pb.ImageStatusRequest(image=pb.ImageSpec(image=ref)), timeout=10)
        return resp.image if resp.HasField("image") else None

    async def cri_list_images(self) -> list[Any]:
        """CRI ListImages: the ``runtime.v1.Image`` messages."""
        from reloadd_containerd_images._proto.cri.runtime.v1 import api_pb2 as pb

        async with self._cri() as stub:
            resp = await stub.ListImages(pb.ListImagesRequest(), timeout=10)
        return list(resp.images)

    async def cri_remove(self, ref: str) -> None:
        """CRI RemoveImage."""
        from reloadd_containerd_images._proto.cri.runtime.v1 import api_pb2 as pb

        async with self._cri() as stub:
            await stub.RemoveImage(pb.RemoveImageRequest(image=pb.ImageSpec(image=ref)), timeout=30)

    @contextlib.asynccontextmanager
    async def _cri(self) -> AsyncIterator[Any]:
        from grpclib.client import Channel
        from reloadd_containerd_images._proto.cri.runtime.v1 import api_grpc

        channel = Channel(path=self.address)
        try:
            yield api_grpc.ImageServiceStub(channel)
        finally:
            channel.close()

    def cleanup_mounts(self) -> None:
        """Unmount whatever the daemon left mounted under its root, state and temp dirs."""
        unmount_under(self.root, self.state, self.tmp)


@contextlib.asynccontextmanager
async def private_containerd(
    tmp_path: Path,
    *,
    hosts_dir: Path | None = None,
    snapshotter: str = "overlayfs",
    name: str = "containerd",
    release: str = "1.6",
    node: NodeCri | None = None,
) -> AsyncIterator[Containerd]:
    """Start a private containerd under ``tmp_path/<name>``; stop and clean it on exit.

    Args:
        tmp_path: Where the instance keeps config, root, state and log.
        hosts_dir: CRI ``registry.config_path`` (a ``certs.d`` dir of ``<host>/hosts.toml``);
            read by containerd per pull, so it may be filled later.
        snapshotter: The CRI default snapshotter.
        name: Sub-directory name, to run several instances in one test.
        release: Which containerd (a key of ``RELEASES``).
        node: CRI settings for a kubelet (:class:`NodeCri`); the session's node (``tests/kube/node.py``)
            starts its own containerd with them.
    """
    rel = get_release(release)
    rel.check()
    d = (tmp_path / name).resolve()
    root, state = d / "root", d / "state"
    for sub in (root, state, d / "cni" / "bin", d / "cni" / "conf", d / "opt", d / "tmp"):
        sub.mkdir(parents=True, exist_ok=True)
    # unix socket paths are limited to 107 bytes: keep them in a short private dir.
    sockdir = Path(tempfile.mkdtemp(prefix="ctd-", dir="/tmp"))
    address = str(sockdir / "containerd.sock")
    config = d / "config.toml"
    config.write_text(containerd_config(d, root, state, address, hosts_dir=hosts_dir, snapshotter=snapshotter,
                                        version=rel.config_version, node=node))
    ctd = Containerd(
        dir=d,
        address=address,
        root=root,
        state=state,
        tmp=d / "tmp",
        hosts_dir=hosts_dir,
        log_path=d / "containerd.log",
        config_path=config,
        release=rel,
    )
    try:
        await ctd.start()
        yield ctd
    finally:
        await ctd.stop()
        ctd.cleanup_mounts()
        shutil.rmtree(sockdir, ignore_errors=True)


def ctr_sync(address: str, args: Sequence[str], namespace: str = "k8s.io", ctr: str = "ctr") -> str:
    """Blocking ``ctr`` call, for benchmarks and scripts."""
    return subprocess.run(
        [ctr, "-a", address, "-n", namespace, *args], check=True, capture_output=True, text=True
    ).stdout
