"""What a test node leaves on the host outside its own directory, recorded before and put back after.

A kubelet and the CRI plugin write to fixed places whatever their flags: the kubelet sets kernel
tunables at start (``vm.overcommit_memory=1``, ``kernel.panic=10``, ``kernel.panic_on_oops=1``, ... unless
``--protect-kernel-defaults``, which refuses to start on a machine that differs), writes pod logs under
``/var/log/pods`` and ``/var/log/containers``, serves its device-plugin socket in
``/var/lib/kubelet/device-plugins`` (a constant, whatever ``--root-dir`` says); containerd bind-mounts network
namespaces in ``/run/netns``, libcni caches results in ``/var/lib/cni/results``, and runc makes each
container's cgroup ``/k8s.io/<container id>`` in every hierarchy (the kubelet runs with
``--cgroups-per-qos=false``: no parent of its own). :class:`HostState` records the before, cleans what
belongs to one node, and reports what is left.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["SYSCTLS", "HostState", "mounts_under", "processes_under"]

SYSCTLS = (
    "vm/overcommit_memory", "vm/panic_on_oom", "kernel/panic", "kernel/panic_on_oops",
    "kernel/keys/root_maxkeys", "kernel/keys/root_maxbytes",
)
"""The kernel settings kubelet 1.20's container manager sets (``setupKernelTunables``)."""

POD_LOGS, CONTAINER_LOGS = Path("/var/log/pods"), Path("/var/log/containers")
CNI_CACHE = Path("/var/lib/cni")
KUBELET_FIXED = Path("/var/lib/kubelet")
CGROUPS = Path("/sys/fs/cgroup")
SHARED_DIRS = (POD_LOGS, CONTAINER_LOGS, CNI_CACHE, Path("/run/netns"), KUBELET_FIXED)


def mounts_under(d: Path) -> list[str]:
    """Mount points at or below ``d``."""
    prefix = str(d)
    out = []
    with open("/proc/self/mountinfo", encoding="utf-8") as f:
        for line in f:
            point = line.split()[4].replace("\\040", " ")
            if point == prefix or point.startswith(prefix + "/"):
                out.append(point)
    return out


def processes_under(d: Path, containers: Collection[str] = ()) -> list[int]:
    """Processes whose command line names ``d`` (containerd, its shims, the kubelet) or that run in the cgroup
    of one of ``containers`` (a container's processes: their root, seen from here, is just ``/``)."""
    prefix, ids = str(d), set(containers)
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            cgroups = Path(f"/proc/{entry}/cgroup").read_text()
        except OSError:
            continue  # exited meanwhile
        in_container = any(line.rsplit("/", 1)[-1] in ids for line in cgroups.splitlines())
        if prefix in cmdline or in_container:
            out.append(int(entry))
    return out


def _read(name: str) -> str:
    return Path("/proc/sys", name).read_text().strip()


@dataclass
class HostState:
    """The host as it was before a node started, and the things of that node to remove from it.

    Attributes:
        network: The node's CNI network name (libcni names its cache entries after it).
        sysctls: Values of :data:`SYSCTLS` before the kubelet started.
        existed: Which of the shared directories existed before.
        pod_uids: UIDs of the pods the node ran (their ``/var/log/pods/<ns>_<name>_<uid>``).
        netns: Network namespace files of the node's sandboxes.
        containers: IDs of the node's containers and sandboxes (their cgroups, their CNI cache entries).
    """

    network: str
    sysctls: dict[str, str] = field(default_factory=dict)
    existed: set[Path] = field(default_factory=set)
    pod_uids: set[str] = field(default_factory=set)
    netns: set[str] = field(default_factory=set)
    containers: set[str] = field(default_factory=set)
    cgroup_parents: set[Path] = field(default_factory=set)

    def record(self) -> None:
        """Note the before (call before containerd and the kubelet start)."""
        self.sysctls = {k: _read(k) for k in SYSCTLS}
        self.existed = {d for d in SHARED_DIRS if d.exists()}
        self.cgroup_parents = {p for p in self._cgroup_parents() if not p.exists()}

    @staticmethod
    def _cgroup_parents() -> list[Path]:
        return [h / "k8s.io" for h in CGROUPS.iterdir() if h.is_dir()] if CGROUPS.is_dir() else []

    def _cgroups(self) -> list[Path]:
        return [p / cid for p in self._cgroup_parents() for cid in self.containers if (p / cid).is_dir()]

    def restore(self) -> None:
        """Remove the node's files from the shared places and put the kernel settings back."""
        for ns in self.netns:
            subprocess.run(["umount", "-l", ns], check=False, capture_output=True)
            with contextlib.suppress(OSError):
                os.unlink(ns)
        for p in self._pod_logs():
            shutil.rmtree(p, ignore_errors=True)
        for link in self._container_logs():
            with contextlib.suppress(OSError):
                link.unlink()
        for f in self._cni_cache():
            with contextlib.suppress(OSError):
                f.unlink()
        for cg in self._cgroups():  # empty once the processes are gone; a cgroup is removed with rmdir
            with contextlib.suppress(OSError):
                cg.rmdir()
        for parent in self.cgroup_parents:  # made by this node's runc; another containerd may use it now
            with contextlib.suppress(OSError):
                parent.rmdir()
        if KUBELET_FIXED not in self.existed:  # only the device-plugin socket and checkpoint are in it
            shutil.rmtree(KUBELET_FIXED, ignore_errors=True)
        for d in SHARED_DIRS:
            if d not in self.existed:
                _remove_empty_tree(d)
        for k, v in self.sysctls.items():
            if _read(k) != v:
                with contextlib.suppress(OSError):
                    Path("/proc/sys", k).write_text(v)

    def leftovers(self) -> list[str]:
        """What of the node is still on the host."""
        out = [f"netns {ns}" for ns in self.netns if os.path.exists(ns)]
        out += [f"pod log {p}" for p in self._pod_logs()]
        out += [f"container log {p}" for p in self._container_logs()]
        out += [f"cni cache {p}" for p in self._cni_cache()]
        out += [f"cgroup {p}" for p in self._cgroups()]
        if KUBELET_FIXED not in self.existed and KUBELET_FIXED.exists():
            out.append(f"dir {KUBELET_FIXED}")
        out += [f"sysctl {k}={_read(k)} (was {v})" for k, v in self.sysctls.items() if _read(k) != v]
        return out

    def _pod_logs(self) -> list[Path]:
        if not POD_LOGS.is_dir():
            return []
        return [p for p in POD_LOGS.iterdir() if p.name.rsplit("_", 1)[-1] in self.pod_uids]

    def _container_logs(self) -> list[Path]:
        """Links in /var/log/containers into a pod log dir of the node (dangling ones included)."""
        if not CONTAINER_LOGS.is_dir():
            return []
        out = []
        for link in CONTAINER_LOGS.iterdir():
            with contextlib.suppress(OSError):
                parts = Path(os.readlink(link)).parts
                if len(parts) > 4 and parts[4].rsplit("_", 1)[-1] in self.pod_uids:  # /var/log/pods/<pod dir>
                    out.append(link)
        return out

    def _cni_cache(self) -> list[Path]:
        results = CNI_CACHE / "results"
        if not results.is_dir():
            return []
        return sorted(p for p in results.iterdir()
                      if p.name.startswith(f"{self.network}-") or any(f"-{c}-" in p.name for c in self.containers))


def _remove_empty_tree(d: Path) -> None:
    """Remove ``d`` if it holds nothing but empty directories (another node may be using it)."""
    if not d.is_dir():
        return
    for sub in sorted((p for p in d.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
        with contextlib.suppress(OSError):
            sub.rmdir()
    with contextlib.suppress(OSError):
        d.rmdir()
