"""A real node in the test bed: a private containerd and a kubelet v1.20.2 registered with a :class:`KubeCluster`.

The control plane of :mod:`tests.kube.apiserver` stores Deployments; with a node, they run. The kubelet is
built from the same Debian source as the apiserver (``make kube``), and talks CRI (v1alpha2) to a private
containerd 1.6 (Debian 12's; 1.7 works too, 2.x dropped v1alpha2) whose CRI section
:class:`tests.infra.NodeCri` writes. What these machines need, measured in
``docs/testbed.md``: ``restrict_oom_score_adj = true`` (no process may lower its ``oom_score_adj`` here),
a sandbox image imported beforehand (nothing can be pulled: it is busybox-static, see
:mod:`tests.infra.busybox`), and CNI from Debian's ``containernetworking-plugins`` (a private bridge and
host-local range, no gateway, no masquerade: nothing is added to the host's routes or iptables).

Example (the session fixture ``kube_node`` of :mod:`tests.kube.fixtures` does this once)::

    with KubeCluster(controllers=NODE_CONTROLLERS, scheduler=True) as cluster, KubeNode(cluster) as node:
        node.address          # containerd's socket: import images here (namespace k8s.io)
        cluster.kubeconfig    # apply Deployments; their pods run on node.name
    assert node.leftovers() == []

Teardown leaves nothing behind: pods are deleted through the API so the kubelet stops them and tears their
network down; then every task still in containerd is killed, the kubelet and containerd are stopped, any
process of theirs still alive is killed, and the bridge, the mounts, the network namespaces, the pods'
``/var/log/pods`` entries, the CNI cache entries and the kernel settings the kubelet changed are put back.
:meth:`KubeNode.leftovers` says what is still there.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import Any

from tests.infra.busybox import PAUSE, busybox_image
from tests.infra.containerd import NodeCri, containerd_config, get_release, unmount_under
from tests.infra.images import write_oci_archive

from .apiserver import KubeCluster, _free_ports, log_tail, terminate
from .hostclean import HostState, mounts_under, processes_under
from .watch import WaitTimeout, condition, wait_for

__all__ = ["NODE_CONTROLLERS", "SANDBOX_IMAGE", "KubeNode", "NodeError", "kube_with_node"]

NODE_CONTROLLERS = ("namespace", "garbagecollector", "deployment", "replicaset", "nodelifecycle")
"""What kube-controller-manager runs next to a node: Deployments get ReplicaSets, ReplicaSets get Pods."""

SANDBOX_IMAGE = "localhost/reloadd-testbed/pause:1"
"""Every pod's sandbox: busybox-static sleeping, imported before the kubelet starts."""


class NodeError(RuntimeError):
    """containerd or the kubelet did not come up (the message has the log tail)."""


class KubeNode:
    """A private containerd and a kubelet, registered with ``cluster`` as node ``name``.

    Args:
        cluster: A started cluster; it must run kube-scheduler and the deployment/replicaset controllers
            for Deployments to run (:data:`NODE_CONTROLLERS`, ``scheduler=True``).
        name: The node's name.
        release: The containerd release (``1.6`` or ``1.7``).
        ready_timeout: Seconds to wait for the node's Ready condition (about 16 s on 2 idle cores).
        hosts_dir: The CRI registry ``config_path`` (a ``certs.d`` dir), as :func:`tests.infra.private_containerd`.
    """

    def __init__(
        self,
        cluster: KubeCluster,
        *,
        name: str = "node1",
        release: str = "1.6",
        ready_timeout: float = 120.0,
        hosts_dir: Path | None = None,
    ) -> None:
        self.hosts_dir = hosts_dir
        self.cluster = cluster
        self.name = name
        self.release = get_release(release)
        if self.release.config_version >= 3:
            raise NodeError(f"containerd {release} dropped CRI v1alpha2, the only CRI a 1.20 kubelet speaks")
        self.ready_timeout = ready_timeout
        self.dir = Path(tempfile.mkdtemp(prefix="reloadd-node-", dir="/tmp")).resolve()
        self.address = str(self.dir / "containerd.sock")
        """containerd's gRPC socket (the CRI endpoint and where reloadd imports images)."""
        self.bridge = "rld" + secrets.token_hex(5)
        """The CNI bridge's name (unique: another node may run on the machine)."""
        self.network = f"reloadd-{self.bridge}"
        self.host = HostState(self.network)
        self._procs: dict[str, subprocess.Popen[bytes]] = {}
        self._spawned: dict[str, tuple[list[str], dict[str, str]]] = {}

    @property
    def kubelet_root(self) -> Path:
        """The kubelet's ``--root-dir``."""
        return self.dir / "kubelet"

    def log_file(self, component: str) -> Path:
        """The log of ``containerd`` or ``kubelet``."""
        return self.dir / f"{component}.log"

    # --- lifecycle ---------------------------------------------------------------------------------
    def start(self) -> None:
        """Start containerd, import the sandbox image, start the kubelet, wait until the node is Ready.

        Raises:
            NodeError: with the relevant log tail.
        """
        self.launch()
        try:
            self.wait_ready()
        except BaseException:
            self.stop()
            raise

    def launch(self, cluster_gone: threading.Event | None = None) -> None:
        """Start containerd, import the sandbox image and start the kubelet, without waiting for Ready.

        The cluster may still be starting (:func:`kube_with_node`): the kubelet is started as soon as the
        cluster's kubeconfig is written, and registers once the API server answers.

        Args:
            cluster_gone: Set when the cluster's start ended (then a kubeconfig that is not there never comes).
        """
        kubelet = self.cluster.bin_dir / "kubelet"
        if not os.access(kubelet, os.X_OK):
            raise NodeError(f"{kubelet} missing: run `make kube` (scripts/infra/build-kube-apiserver.sh)")
        self.release.check()
        atexit.register(self.stop)
        try:
            self.host.record()
            self._start_containerd()
            archive = self.dir / "pause.tar"
            write_oci_archive(archive, [busybox_image(SANDBOX_IMAGE, PAUSE)])
            self.ctr("images", "import", str(archive))
            while not self.cluster.kubeconfig.exists():
                if cluster_gone is not None and cluster_gone.wait(0.05):
                    if not self.cluster.kubeconfig.exists():
                        raise NodeError("the cluster did not start: no kubeconfig for the kubelet")
                elif cluster_gone is None:
                    raise NodeError(f"{self.cluster.kubeconfig} missing: start the cluster first")
            self._start_kubelet()
        except BaseException:
            self.stop()
            raise

    def _start_containerd(self) -> None:
        d = self.dir
        conf = d / "cni"
        conf.mkdir()
        (conf / "10-reloadd.conflist").write_text(json.dumps({
            "cniVersion": "0.4.0", "name": self.network,
            "plugins": [
                {"type": "bridge", "bridge": self.bridge, "isGateway": False, "ipMasq": False,
                 "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.88.0.0/24"}]],
                          "dataDir": str(d / "cni-ipam")}},
                {"type": "portmap", "capabilities": {"portMappings": True}},
            ],
        }, indent=1))
        node = NodeCri(sandbox_image=SANDBOX_IMAGE, cni_conf_dir=conf, runc_root=d / "runc")
        config = d / "containerd.toml"
        config.write_text(containerd_config(d, d / "root", d / "state", self.address, hosts_dir=self.hosts_dir,
                                            version=self.release.config_version, node=node))
        (d / "tmp").mkdir()
        env = dict(os.environ, TMPDIR=str(d / "tmp"))
        if self.release.bin_dir is not None:
            env["PATH"] = f"{self.release.bin_dir}{os.pathsep}{env.get('PATH', '')}"
        self._spawn("containerd", [self.release.binary("containerd"), "--config", str(config)], env)
        self._wait_containerd()

    def _wait_containerd(self) -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            self._check_alive()
            if os.path.exists(self.address):
                plugins = self.ctr("plugins", "ls", check=False)
                cri = [ln for ln in plugins.splitlines() if ln.split()[:2] == ["io.containerd.grpc.v1", "cri"]]
                if cri and cri[0].split()[-1] == "ok":
                    return
                if cri:
                    raise NodeError(f"containerd's CRI plugin did not load: {cri[0]}\n{self._tail('containerd')}")
            time.sleep(0.05)  # a fresh daemon's socket: there is no event to await
        raise NodeError(f"containerd not ready after 30 s:\n{self._tail('containerd')}")

    def _start_kubelet(self) -> None:
        root = self.kubelet_root
        (root / "pki").mkdir(parents=True)
        (port,) = _free_ports(1)
        self._spawn("kubelet", [
            str(self.cluster.bin_dir / "kubelet"),
            f"--kubeconfig={self.cluster.kubeconfig}",
            "--container-runtime=remote", f"--container-runtime-endpoint=unix://{self.address}",
            f"--containerd={self.address}",  # cAdvisor's stats: this containerd, not the system's socket
            "--cgroup-driver=cgroupfs", "--cgroups-per-qos=false", "--enforce-node-allocatable=",
            "--fail-swap-on=false", "--eviction-hard=",
            "--image-gc-high-threshold=100", "--image-gc-low-threshold=99",  # reloadd owns the images
            f"--pod-infra-container-image={SANDBOX_IMAGE}",
            f"--hostname-override={self.name}",
            "--address=127.0.0.1", f"--port={port}", "--read-only-port=0", "--healthz-port=0",
            "--anonymous-auth=false", "--authorization-mode=AlwaysAllow",
            f"--root-dir={root}", f"--cert-dir={root / 'pki'}", f"--volume-plugin-dir={root / 'volume-plugins'}",
            "--make-iptables-util-chains=false",  # no KUBE-* chains left in the host's iptables
            "--node-status-update-frequency=1s",  # Ready reported as soon as it is true (sent on change only)
            "--kube-api-qps=50", "--kube-api-burst=100", "--v=2",
        ], dict(os.environ))

    def wait_ready(self) -> None:
        """Wait until the node's Ready condition is True (the cluster must be serving)."""
        deadline = time.monotonic() + self.ready_timeout
        while True:
            self._check_alive()
            left = deadline - time.monotonic()
            if left <= 0:
                raise NodeError(f"node {self.name} not Ready after {self.ready_timeout} s:\n{self._tail('kubelet')}")
            try:
                wait_for(self.cluster, "/api/v1/nodes", lambda n: condition(n, "Ready") == "True",
                         name=self.name, timeout=min(left, 5.0))
                return
            except WaitTimeout:
                continue  # check the kubelet is alive, then watch again

    def _spawn(self, name: str, argv: list[str], env: dict[str, str]) -> None:
        self._spawned[name] = (argv, env)
        with open(self.log_file(name), "ab") as log:
            self._procs[name] = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, cwd=self.dir, env=env,
                start_new_session=True,
            )

    def _check_alive(self) -> None:
        for name, proc in self._procs.items():
            if proc.poll() is not None:
                raise NodeError(f"{name} exited with {proc.returncode}:\n{self._tail(name)}")

    def kill(self, component: str) -> None:
        """SIGKILL ``containerd`` or ``kubelet`` (a crash: no cleanup on its side) and reap it."""
        proc = self._procs[component]
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        proc.wait(timeout=15)

    def assert_running(self) -> None:
        """Raise :class:`NodeError` if containerd or the kubelet died."""
        self._check_alive()

    def _tail(self, name: str, lines: int = 30) -> str:
        return log_tail(self.log_file(name), lines)

    # --- teardown ----------------------------------------------------------------------------------
    def stop(self) -> None:
        """Stop everything and clean the host (idempotent; see the module docstring for the order)."""
        atexit.unregister(self.stop)
        if self._procs.get("kubelet") is not None and self._procs["kubelet"].poll() is None:
            with contextlib.suppress(Exception):  # a dead apiserver must not stop the cleanup
                self._drain()
        self.host.pod_uids.update(p.name for p in (self.kubelet_root / "pods").glob("*"))
        self._terminate("kubelet")
        ctd = self._procs.get("containerd")
        if ctd is not None and ctd.poll() is not None:  # it died: only it knows its containers and netns
            with contextlib.suppress(NodeError):
                self._spawn("containerd", *self._spawned["containerd"])
                self._wait_containerd()
        if ctd is not None:
            self._kill_tasks()
        self._terminate("containerd")
        for pid in processes_under(self.dir, self.host.containers):  # shims, containers that outlived containerd
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        subprocess.run(["ip", "link", "del", self.bridge], check=False, capture_output=True)
        unmount_under(self.dir)
        self.host.restore()
        shutil.rmtree(self.dir, ignore_errors=True)

    def _drain(self) -> None:
        """Cordon the node and delete its pods, so the kubelet stops them and tears their network down."""
        self.cluster.request("PATCH", f"/api/v1/nodes/{self.name}", {"spec": {"unschedulable": True}},
                             content_type="application/merge-patch+json", timeout=5)
        _, pods = self.cluster.request("GET", f"/api/v1/pods?fieldSelector=spec.nodeName%3D{self.name}", timeout=5)
        for pod in pods.get("items") or []:
            meta = pod["metadata"]
            self.host.pod_uids.add(meta["uid"])
            self.cluster.request("DELETE", f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}",
                                 {"gracePeriodSeconds": 0}, timeout=5)
        deadline = time.monotonic() + 30
        while self.ctr("tasks", "ls", "-q", check=False).split() and time.monotonic() < deadline:
            time.sleep(0.1)  # the kubelet stops the sandboxes on its own schedule: nothing to await

    def _kill_tasks(self) -> None:
        """Kill what the kubelet did not stop; note each container and sandbox network namespace for the cleanup."""
        for cid in self.ctr("containers", "ls", "-q", check=False).split():
            self.host.containers.add(cid)
            try:
                spec = json.loads(self.ctr("containers", "info", cid, check=False) or "{}").get("Spec") or {}
            except ValueError:
                spec = {}
            for ns in (spec.get("linux") or {}).get("namespaces") or []:
                if ns.get("type") == "network" and ns.get("path"):
                    self.host.netns.add(ns["path"])
        for tid in self.ctr("tasks", "ls", "-q", check=False).split():
            self.ctr("tasks", "kill", "-a", "-s", "SIGKILL", tid, check=False)
            self.ctr("tasks", "rm", "-f", tid, check=False)

    def _terminate(self, name: str) -> None:
        terminate(self._procs.pop(name, None))

    def leftovers(self) -> list[str]:
        """What the node left on the machine after :meth:`stop`: processes, mounts, links, files, settings."""
        out = [f"process {pid}" for pid in processes_under(self.dir, self.host.containers)]
        out += [f"mount {m}" for m in mounts_under(self.dir)]
        if subprocess.run(["ip", "link", "show", self.bridge], capture_output=True).returncode == 0:
            out.append(f"link {self.bridge}")
        if self.dir.exists():
            out.append(f"dir {self.dir}")
        return out + self.host.leftovers()

    # --- helpers for tests -------------------------------------------------------------------------
    def ctr(self, *args: str, namespace: str = "k8s.io", check: bool = True) -> str:
        """Run ``ctr -a <socket> -n <namespace> args...``; its stdout."""
        proc = subprocess.run([self.release.binary("ctr"), "-a", self.address, "-n", namespace, *args],
                              capture_output=True, text=True, timeout=60)
        if check and proc.returncode != 0:
            raise NodeError(f"ctr {' '.join(args)} failed ({proc.returncode}): {proc.stderr.strip()}")
        return proc.stdout

    def __enter__(self) -> KubeNode:
        self.start()
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()



@contextlib.contextmanager
def kube_with_node(**node_options: Any) -> Iterator[KubeNode]:
    """A cluster for a node (:data:`NODE_CONTROLLERS`, kube-scheduler) and a :class:`KubeNode` on it, Ready.

    Both start side by side: containerd and the kubelet's own start-up (~8 s) overlap the control plane's
    (7-17 s here). On exit the node is stopped first (its pods are deleted through the API), then the cluster.
    ``node.cluster`` is the cluster.

    Args:
        node_options: Passed to :class:`KubeNode` (``name``, ``release``, ``hosts_dir``, ...).
    """
    cluster = KubeCluster(controllers=NODE_CONTROLLERS, scheduler=True)
    node = KubeNode(cluster, **node_options)
    started = threading.Event()
    failure: list[BaseException] = []

    def start_cluster() -> None:
        try:
            cluster.start()
        except BaseException as exc:  # handed to the caller's thread below
            failure.append(exc)
        finally:
            started.set()

    thread = threading.Thread(target=start_cluster, name="kube-start", daemon=True)
    thread.start()
    try:
        try:
            node.launch(started)
        finally:
            thread.join()
        if failure:
            raise failure[0]
        node.wait_ready()
        yield node
    finally:
        node.stop()
        cluster.stop()
