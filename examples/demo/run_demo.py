"""``make demo``: reloadd on a private containerd and a local registry, in a temp dir.

Run from the repository root::

    python -m examples.demo.run_demo            # interactive: prints what to drop where
    python -m examples.demo.run_demo --smoke    # drops the samples itself, checks all three, exits
    make demo DEMO_ARGS=--smoke                 # the same through make

It starts (all in one temp dir, nothing system-wide is touched):

* a private containerd (its own root, state and socket) whose CRI registry
  ``config_path`` is the demo's ``certs.d``;
* a local ``docker-registry`` on 127.0.0.1 holding ``demo/hello:v2``;
* a throwaway etcd + kube-apiserver (or your own cluster through ``--kubeconfig``). When
  ``make kube`` has not built one yet, images and mirrors start at once and the kube-apiserver is
  built in the background (about 7 minutes, once; cached in /var/cache/reloadd); the manifests
  folder is switched on when it is ready (the demo says so and restarts reloadd with it);
* when ``make kube`` has built the kubelet and kube-scheduler too, a real node (the test bed's
  ``tests/kube/node.py``): the private containerd is the kubelet's runtime, and the sample manifest is
  a Deployment of the sample image. Then the smoke run shows the air-gap flow: the tarball, the mirror
  drop-in and the Deployment dropped together; the mirror written, the image imported, the Deployment
  applied, its pod running (``--no-node`` keeps the ConfigMap sample and no kubelet);
* ``reloadd run`` watching ``examples/demo/images``, ``registries.conf.d`` and
  ``manifests`` with the ``containerd-images``, ``registry-mirrors`` and
  ``kube-manifests`` plugins.

Ctrl-C stops reloadd, the cluster, the registry and containerd, and removes the temp dir.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import platform
import shutil
import signal
import socket
import sys
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, BinaryIO

REPO = Path(__file__).resolve().parents[2]
if __package__ in (None, ""):  # run as a script (python examples/demo/run_demo.py)
    sys.path.insert(0, str(REPO))

# importable once REPO is on sys.path (run as a script), hence after it
from examples.demo._common import BOLD, DIM, IMAGE_V1, IMAGE_V2, RESET, SAMPLE_DROPS, run_command, say, until  # noqa: E402 - see above
from examples.demo.node import hello_deployment, node_binaries, node_instructions, smoke_node  # noqa: E402 - idem

HERE = Path(__file__).resolve().parent
NEEDED = ("containerd", "ctr", "docker-registry", "skopeo")

def _arch() -> str:
    return {"x86_64": "amd64", "aarch64": "arm64"}.get(platform.machine(), platform.machine())


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'


def write_config(root: Path, folders: Path, ctd_address: str, kubeconfig: Path | None, port: int) -> Path:
    """The demo's reloadd.toml."""
    sections: list[tuple[str, dict[str, Any], dict[str, Any]]] = [
        # Order: mirrors first (a .txt pull uses the new mirror), then images, then manifests.
        ("mirrors", {"plugin": "registry-mirrors", "paths": [str(folders / "registries.conf.d")]},
         {"registries_conf": str(root / "registries.conf"),  # absent: drop-ins only
          "registries_conf_d": str(folders / "registries.conf.d"),
          "hosts_dir": str(root / "certs.d"), "certs_dirs": [], "containerd_config": ""}),
        ("images", {"plugin": "containerd-images", "paths": [str(folders / "images")], "after": ["mirrors"]},
         {"address": ctd_address, "namespace": "k8s.io"}),
    ]
    if kubeconfig is not None:
        sections.append(("manifests", {"plugin": "kube-manifests", "paths": [str(folders / "manifests")],
                                       "after": ["images"]},
                         {"kubeconfig": str(kubeconfig), "namespace": "kube-system"}))
    lines = [
        "[reloadd]",
        f"state_dir = {_toml(root / 'state')}",
        'quiet = "50ms"',
        f"control_socket = {_toml(root / 'control.sock')}",
        f"pid_file = {_toml(root / 'reloadd.pid')}",
        f'metrics_listen = "127.0.0.1:{port}"',
    ]
    for name, table, options in sections:
        lines += ["", "[[consumer]]", f"name = {_toml(name)}"]
        lines += [f"{k} = {_toml(v)}" for k, v in table.items()]
        lines.append("[consumer.options]")
        lines += [f"{k} = {_toml(v)}" for k, v in options.items()]
    path = root / "reloadd.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


async def make_samples(root: Path, registry_host: str, node: bool = False) -> Path:
    """An image tarball, a mirror drop-in and a manifest to drop into the watched folders.

    With a node the image really runs (busybox-static, :mod:`tests.infra.busybox`) and the manifest adds a
    Deployment of it to its ConfigMap; without, the image is generated bytes and the manifest the ConfigMap alone.
    """
    from tests.infra import SERVE, ImageSpec, busybox_image, push_image, write_oci_archive

    samples = root / "samples"
    samples.mkdir()
    plat = (f"linux/{_arch()}",)
    v1 = busybox_image(IMAGE_V1, SERVE) if node else ImageSpec(IMAGE_V1, platforms=plat, seed="demo-v1")
    write_oci_archive(samples / "hello.tar", [v1])
    v2 = root / "hello-v2.tar"
    write_oci_archive(v2, [ImageSpec(IMAGE_V2, platforms=plat, seed="demo-v2")])
    await push_image(v2, f"{registry_host}/demo/hello:v2")
    (samples / "50-demo-mirror.conf").write_text(
        '# pull docker.io images through the demo registry first (it holds demo/hello:v2)\n'
        '[[registry]]\nprefix = "docker.io"\nlocation = "docker.io"\n'
        f'[[registry.mirror]]\nlocation = "{registry_host}"\ninsecure = true\n'
    )
    greeting = (
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: hello-from-reloadd\n  namespace: default\n"
        "data:\n  greeting: hello\n"
    )
    # The ConfigMap is in both, so the README's first result reads the same with a node or without.
    (samples / "hello.yaml").write_text(greeting + "---\n" + hello_deployment() if node else greeting)
    return samples


def manifest_instructions(folders: Path, samples: Path, kube: Any) -> str:
    """How to try the manifests folder against ``kube``."""
    rel = folders.relative_to(Path.cwd()) if folders.is_relative_to(Path.cwd()) else folders
    return "\n".join([
        f"{BOLD}3. Apply a manifest{RESET}: drop YAML into {rel}/manifests/",
        f"     cp {samples}/hello.yaml {rel}/manifests/",
        f"     curl -s --cacert {kube.ca_file} -H 'Authorization: Bearer {kube.admin_token}' \\",
        f"       {kube.server}/api/v1/namespaces/default/configmaps/hello-from-reloadd",
        f"     rm {rel}/manifests/hello.yaml   {DIM}# pruned from the cluster{RESET}",
        "",
    ])


def instructions(root: Path, folders: Path, samples: Path, ctd: str, cfg: Path, port: int,
                 kube: Any | None, building: bool = False, node: bool = False) -> str:
    """What to drop where and what to run to see the result."""
    rel = folders.relative_to(Path.cwd()) if folders.is_relative_to(Path.cwd()) else folders
    ctr = f"ctr -a {ctd} -n k8s.io"
    if node and kube is not None:
        return node_instructions(root, rel, samples, ctr, cfg, port, kube)
    out = [
        f"{BOLD}reloadd demo is running{RESET} (work dir {root}). In another terminal:",
        "",
        f"{BOLD}1. Import an image{RESET}: drop a tarball into {rel}/images/",
        f"     cp {samples}/hello.tar {rel}/images/",
        f"     {ctr} images ls -q            {DIM}# {IMAGE_V1} appears{RESET}",
        f"     rm {rel}/images/hello.tar     {DIM}# unpinned: the kubelet's image GC may now remove it{RESET}",
        "",
        f"{BOLD}2. Add a registry mirror{RESET}: drop a registries.conf(5) file into {rel}/registries.conf.d/",
        f"     cp {samples}/50-demo-mirror.conf {rel}/registries.conf.d/",
        f"     cat {root}/certs.d/docker.io/hosts.toml",
        f"     {ctr} images pull --hosts-dir {root}/certs.d {IMAGE_V2}   {DIM}# served by the demo registry{RESET}",
        "",
    ]
    if kube is not None:
        out.append(manifest_instructions(folders, samples, kube))
    elif building:
        out += [f"{DIM}3. Manifests: on as soon as the kube-apiserver build finishes (see below){RESET}", ""]
    else:
        out += [f"{DIM}3. Manifests: off (--no-kube){RESET}", ""]
    out += [
        f"{BOLD}Watch it{RESET}:",
        f"     reloadd status --config {cfg}",
        f"     curl -s http://127.0.0.1:{port}/metrics | grep ^reloadd_",
        f"     curl -s http://127.0.0.1:{port}/readyz",
        f"     reloadd reload --config {cfg}        {DIM}# forced full resync{RESET}",
        "",
        "Ctrl-C stops everything the demo started.",
    ]
    return "\n".join(out)


def write_env(folders: Path, root: Path, cfg: Path, ctd: str, port: int, kube: Any | None) -> Path:
    """``<folders>/demo.env``: what the commands in README.md and docs/ need, for a second shell to source.

    It names this run's temp dir, so the documented commands are the same on every run; it is
    removed when the demo stops.
    """
    bin_dir = Path(sys.executable).parent
    lines = [
        "# Written by `make demo` (examples/demo/run_demo.py) for the commands in README.md and docs/;",
        "# removed when the demo stops. Source it: . examples/demo/demo.env",
        f"export DEMO={root}",
        f"export SAMPLES={root / 'samples'}",
        f"export RELOADD_CONFIG={cfg}",
        f"export CONTAINERD_ADDRESS={ctd}",
        f"export HOSTS_DIR={root / 'certs.d'}",
        f"export METRICS=http://127.0.0.1:{port}",
        f'export PATH="{bin_dir}:$PATH"',
        "# the images in the demo's containerd (namespace k8s.io)",
        'images() { ctr -a "$CONTAINERD_ADDRESS" -n k8s.io images ls -q; }',
        "# wait_for TEXT CMD...: run CMD until its output has a line containing TEXT (60 s at most); print those",
        "wait_for() {",
        '  local text=$1 i out; shift',
        '  for i in $(seq 300); do',
        '    out=$("$@" 2>/dev/null) || true',
        '    if printf "%s\\n" "$out" | grep -F -- "$text"; then return 0; fi',
        "    sleep 0.2",
        "  done",
        '  echo "timed out waiting for $text in: $*" >&2; return 1',
        "}",
        "# wait_gone CMD...: run CMD until it fails (60 s at most)",
        "wait_gone() {",
        '  local i; for i in $(seq 300); do "$@" >/dev/null 2>&1 || { echo "gone: $*"; return 0; }; sleep 0.2; done',
        '  echo "timed out waiting for $* to fail" >&2; return 1',
        "}",
    ]
    if kube is not None:
        lines += [
            f"export KUBE_SERVER={kube.server}",
            "# kube_get configmaps/NAME: GET an object of namespace default from the demo's kube-apiserver",
            f"kube_get() {{ curl -sf --cacert {kube.ca_file} -H 'Authorization: Bearer {kube.admin_token}' "
            '"$KUBE_SERVER/api/v1/namespaces/default/$1"; }',
        ]
    path = folders / "demo.env"
    tmp = path.with_suffix(".tmp")
    tmp.write_text("\n".join(lines) + "\n")
    tmp.replace(path)  # a reader never sees half of it
    return path



async def smoke(root: Path, folders: Path, samples: Path, ctd: str, cfg: Path,
                kube: Callable[[], Awaitable[Any | None]]) -> None:
    """Do what the instructions say and check each result (``kube()`` waits for the cluster, if any)."""
    ctr = ["ctr", "-a", ctd, "-n", "k8s.io"]
    shutil.copy(samples / "hello.tar", folders / "images" / "hello.tar")

    async def imported() -> bool:
        return IMAGE_V1 in (await run_command(*ctr, "images", "ls", "-q"))[1].split()

    await until(imported, f"{IMAGE_V1} in containerd")
    say(f"smoke: {IMAGE_V1} imported into containerd")

    shutil.copy(samples / "50-demo-mirror.conf", folders / "registries.conf.d" / "50-demo-mirror.conf")
    hosts = root / "certs.d" / "docker.io" / "hosts.toml"

    async def mirrored() -> bool:
        return hosts.exists()

    await until(mirrored, str(hosts))
    code, out = await run_command(*ctr, "images", "pull", "--hosts-dir", str(root / "certs.d"), IMAGE_V2)
    if code != 0:
        raise RuntimeError(f"pull through the mirror failed: {out}")
    say(f"smoke: {IMAGE_V2} pulled through the mirror")

    cluster = await kube()
    if cluster is not None:
        shutil.copy(samples / "hello.yaml", folders / "manifests" / "hello.yaml")

        async def applied() -> bool:
            got = await asyncio.to_thread(cluster.get, "/api/v1/namespaces/default/configmaps/hello-from-reloadd")
            return got is not None

        await until(applied, "the ConfigMap")
        say("smoke: manifests/hello.yaml applied")
    code, out = await run_command(sys.executable, "-m", "reloadd", "status", "--config", str(cfg))
    say(out)
    if code not in (0, 3):
        raise RuntimeError(f"reloadd status failed ({code})")


def _kube_binaries() -> bool:
    from tests.kube.apiserver import kube_bin_dir

    return os.access(kube_bin_dir() / "kube-apiserver", os.X_OK) and shutil.which("etcd") is not None


def _append(path: Path) -> BinaryIO:
    """A log file for a child process to append to."""
    return open(path, "ab")


async def build_kube(log: Path) -> None:
    """Build kube-apiserver v1.20.2 into the cache the tests use (scripts/infra/build-kube-apiserver.sh).

    ``RELOADD_KUBE_BUILD`` names another build script (the demo's own test uses a fast stand-in).
    """
    from tests.kube.apiserver import kube_bin_dir

    script = os.environ.get("RELOADD_KUBE_BUILD") or str(REPO / "scripts" / "infra" / "build-kube-apiserver.sh")
    with _append(log) as out:
        proc = await asyncio.create_subprocess_exec(
            "bash", script,
            env={**os.environ, "OUT": str(kube_bin_dir())}, stdin=asyncio.subprocess.DEVNULL,
            stdout=out, stderr=out, start_new_session=True,
        )
        try:
            code = await proc.wait()
        except asyncio.CancelledError:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            raise
    if code != 0 or not _kube_binaries():
        raise RuntimeError(f"building kube-apiserver failed ({code}); see {log}")


class Daemon:
    """``reloadd run`` as a child process, restartable with a new config."""

    def __init__(self) -> None:
        self.proc: asyncio.subprocess.Process | None = None
        self._settled = asyncio.Event()  # clear while a restart is under way
        self._settled.set()

    async def start(self, cfg: Path) -> None:
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "reloadd", "run", "--config", str(cfg),
            stdin=asyncio.subprocess.DEVNULL, start_new_session=True,
        )

    async def restart(self, cfg: Path) -> None:
        """Stop the running daemon and start it again on ``cfg`` (its state carries over)."""
        self._settled.clear()
        try:
            await self.stop()
            await self.start(cfg)
        finally:
            self._settled.set()

    async def stop(self) -> None:
        if self.proc is not None:
            await _stop(self.proc)

    async def exited(self) -> int:
        """Wait until the daemon exits on its own (an exit caused by a restart does not count)."""
        while True:
            proc = self.proc
            assert proc is not None
            code = await proc.wait()
            await self._settled.wait()
            if proc is self.proc:
                return code


async def demo(args: argparse.Namespace) -> int:
    """Start everything, run reloadd until Ctrl-C (or the smoke check ends), stop everything."""
    from tests.infra import local_registry, private_containerd
    from tests.kube.apiserver import KubeCluster
    from tests.kube.node import kube_with_node

    missing = [b for b in NEEDED if shutil.which(b) is None]
    if missing:
        say(f"missing {', '.join(missing)}: run `make deps` (Debian packages) first")
        return 2
    folders: Path = args.folders
    root = Path(tempfile.mkdtemp(prefix="reloadd-demo-", dir="/tmp"))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    daemon = Daemon()
    tasks: list[asyncio.Task[Any]] = []
    try:
        async with contextlib.AsyncExitStack() as stack:
            kubeconfig = Path(args.kubeconfig) if args.kubeconfig else None
            use_node = kubeconfig is None and not args.no_kube and not args.no_node and node_binaries()
            kube: KubeCluster | None = None
            reg = await stack.enter_async_context(local_registry(root))
            if use_node:
                say("starting a local registry, etcd, kube-apiserver, kube-scheduler, a private containerd "
                    "and a kubelet (a real node, ~20 s) ...")
                starting = kube_with_node(hosts_dir=root / "certs.d")
                node = await asyncio.to_thread(starting.__enter__)
                stack.push(starting.__exit__)  # the node stopped first (its pods deleted), then the cluster
                kube = node.cluster
                ctd_address = node.address
                kubeconfig = kube.kubeconfig
                say(f"node {node.name} is Ready")
            else:
                say("starting a local registry and a private containerd ...")
                ctd_address = (await stack.enter_async_context(
                    private_containerd(root, hosts_dir=root / "certs.d"))).address
            samples = await make_samples(root, reg.host, node=use_node)
            port = _free_port()

            async def start_cluster() -> KubeCluster:
                say("starting etcd and kube-apiserver ...")
                cluster = KubeCluster(controllers=())
                await asyncio.to_thread(cluster.start)
                stack.callback(cluster.stop)
                return cluster

            building = kubeconfig is None and not args.no_kube and not _kube_binaries()
            if kubeconfig is None and not args.no_kube and not building:
                kube = await start_cluster()
                kubeconfig = kube.kubeconfig
            cfg = write_config(root, folders, ctd_address, kubeconfig, port)
            await daemon.start(cfg)
            stack.callback(lambda: (folders / "demo.env").unlink(missing_ok=True))
            env = write_env(folders, root, cfg, ctd_address, port, kube)
            say("")
            say(instructions(root, folders, samples, ctd_address, cfg, port, kube, building, use_node))
            say(f"The commands in README.md and docs/ need {env}: . {env}")
            say("")

            cluster_ready: asyncio.Future[KubeCluster | None] = loop.create_future()
            if building:
                log = root / "kube-build.log"
                say(f"building kube-apiserver v1.20.2 in the background (about 7 min, once; log {log}); "
                    "the manifests folder is switched on when it is ready")

                async def build_then_enable() -> None:
                    try:
                        await build_kube(log)
                        cluster = await start_cluster()
                        await daemon.restart(write_config(root, folders, ctd_address, cluster.kubeconfig, port))
                        write_env(folders, root, cfg, ctd_address, port, cluster)
                        say("")
                        say(f"{BOLD}kube-apiserver is ready: the manifests folder is on{RESET} (reloadd restarted)")
                        say(manifest_instructions(folders, samples, cluster))
                        cluster_ready.set_result(cluster)
                    except Exception as exc:
                        say(f"manifests stay off: {exc}")
                        cluster_ready.set_result(None)

                tasks.append(asyncio.create_task(build_then_enable()))
            else:
                cluster_ready.set_result(kube)

            async def wait_cluster() -> KubeCluster | None:
                return await cluster_ready

            waiter = asyncio.create_task(daemon.exited())
            tasks.append(waiter)
            if args.smoke:
                if use_node:
                    assert kube is not None
                    work = asyncio.create_task(smoke_node(root, folders, samples, ctd_address, cfg, kube, port))
                else:
                    work = asyncio.create_task(smoke(root, folders, samples, ctd_address, cfg, wait_cluster))
                done, _ = await asyncio.wait({work, waiter}, return_when=asyncio.FIRST_COMPLETED)
                if work not in done:
                    work.cancel()
                    raise RuntimeError(f"reloadd exited early with {waiter.result()}")
                work.result()
                say("smoke: OK")
            else:
                stopper = asyncio.create_task(stop.wait())
                await asyncio.wait({stopper, waiter}, return_when=asyncio.FIRST_COMPLETED)
                stopper.cancel()
            say("stopping ...")
            for t in tasks:
                t.cancel()
            await daemon.stop()
    finally:
        for t in tasks:
            t.cancel()
        await daemon.stop()
        if args.smoke:
            remove_dropped(folders, root / "samples")
        if args.keep:
            say(f"kept {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
    return 0


def remove_dropped(folders: Path, samples: Path) -> None:
    """Take back the samples a smoke run dropped (same bytes only), so the next run starts from empty folders."""
    for sub, name in SAMPLE_DROPS:
        dropped, sample = folders / sub / name, samples / name
        with contextlib.suppress(OSError):
            if dropped.read_bytes() == sample.read_bytes():
                dropped.unlink()


async def _stop(proc: asyncio.subprocess.Process) -> None:
    if proc.returncode is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(signal.SIGTERM)
    try:
        await asyncio.wait_for(proc.wait(), 20)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()


def main(argv: list[str] | None = None) -> int:
    """Entry point."""
    ap = argparse.ArgumentParser(prog="run_demo", description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--folders", default=str(HERE), help="where images/, registries.conf.d/, manifests/ are")
    ap.add_argument("--kubeconfig", help="apply manifests to this cluster instead of a throwaway one")
    ap.add_argument("--no-kube", action="store_true", help="do not start a kube-apiserver")
    ap.add_argument("--no-node", action="store_true", help="no kubelet: the manifest sample is a ConfigMap")
    ap.add_argument("--smoke", action="store_true", help="drop the samples, check the results, exit")
    ap.add_argument("--keep", action="store_true", help="keep the temp dir")
    args = ap.parse_args(argv)
    args.folders = Path(args.folders).resolve()
    for sub in ("images", "registries.conf.d", "manifests"):
        (args.folders / sub).mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        say("the demo starts containerd, which needs root: run it as root (e.g. sudo make demo)")
        return 2
    try:
        return asyncio.run(demo(args))
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
