"""Start a real etcd + kube-apiserver + kube-controller-manager on loopback for tests.

The binaries come from ``$RELOADD_KUBE_BIN`` (default ``/var/cache/reloadd/kube-v1.20.2``), built by
``scripts/infra/build-kube-apiserver.sh`` (``make kube``); etcd is Debian's ``etcd-server``. Everything runs
as child processes on free loopback ports inside a temporary directory with freshly generated certificates
and tokens, and is torn down afterwards. Only the standard library and ``openssl`` are used, so any test
suite can import this module.

Synchronous use (a session fixture)::

    with KubeCluster() as kube:
        kube.kubeconfig            # admin kubeconfig (token)
        kube.request("GET", "/api/v1/namespaces")

Asynchronous use::

    async with kube_cluster() as kube:
        ...

Identities:
    * ``admin_token`` – user ``admin`` in ``system:masters`` (kubeconfig: :attr:`KubeCluster.kubeconfig`).
    * ``restricted_token`` – user ``restricted`` in group ``reloadd:restricted`` with no RBAC at all; tests
      grant it what they need (kubeconfig: :attr:`KubeCluster.restricted_kubeconfig`).
    * a client certificate for user ``cert-admin`` in ``system:masters``
      (kubeconfig: :attr:`KubeCluster.cert_kubeconfig`).
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

__all__ = ["DEFAULT_BIN_DIR", "KubeCluster", "KubeStartError", "kube_bin_dir", "kube_cluster", "log_tail", "terminate"]

DEFAULT_BIN_DIR = Path("/var/cache/reloadd/kube-v1.20.2")
RESTRICTED_USER = "restricted"
RESTRICTED_GROUP = "reloadd:restricted"


class KubeStartError(RuntimeError):
    """etcd, kube-apiserver or kube-controller-manager failed to start (message has the log tail)."""


def kube_bin_dir() -> Path:
    """The directory holding ``kube-apiserver`` and ``kube-controller-manager``."""
    return Path(os.environ.get("RELOADD_KUBE_BIN") or DEFAULT_BIN_DIR)


def terminate(proc: subprocess.Popen[bytes] | None, timeout: float = 15.0) -> None:
    """SIGTERM ``proc`` and reap it; SIGKILL it if it has not exited after ``timeout`` seconds."""
    if proc is None or proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        proc.wait(timeout=timeout)


def log_tail(path: Path, lines: int = 30) -> str:
    """The last ``lines`` lines of a child's log file ("" when it cannot be read)."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def _free_ports(n: int) -> list[int]:
    """``n`` distinct free TCP ports on 127.0.0.1 (held open together so they differ)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def _make_certs(d: Path) -> None:
    """CA, serving cert (SAN 127.0.0.1/localhost), admin client cert, service-account key pair."""
    d.mkdir(parents=True, exist_ok=True)
    _openssl("genrsa", "-out", "sa.key", "2048", cwd=d)
    _openssl("rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=d)
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt",
             "-days", "30", "-subj", "/CN=reloadd-test-ca", cwd=d)
    (d / "serving.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    (d / "client.ext").write_text("extendedKeyUsage=clientAuth\n")
    for name, subj, ext in (
        ("apiserver", "/CN=kube-apiserver", "serving.ext"),
        ("admin", "/O=system:masters/CN=cert-admin", "client.ext"),
    ):
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr",
                 "-subj", subj, cwd=d)
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
                 "-CAcreateserial", "-out", f"{name}.crt", "-days", "30", "-extfile", ext, cwd=d)


def _kubeconfig(server: str, ca: Path, user: dict[str, str]) -> str:
    return json.dumps(
        {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "test", "cluster": {"server": server, "certificate-authority": str(ca)}}],
            "users": [{"name": "test", "user": user}],
            "contexts": [{"name": "test", "context": {"cluster": "test", "user": "test"}}],
            "current-context": "test",
        },
        indent=2,
    )


class KubeCluster:
    """A throw-away control plane: etcd, kube-apiserver and kube-controller-manager.

    Args:
        bin_dir: Directory with the kube binaries (default :func:`kube_bin_dir`).
        workdir: Where to put certs, data and logs (default: a new temp dir, removed on stop).
        controllers: Controllers kube-controller-manager runs; empty to not start it.
        startup_timeout: Seconds to wait for ``/readyz``.
        scheduler: Also start kube-scheduler (a node's pods need it: ``tests/kube/node.py``).
    """

    def __init__(
        self,
        bin_dir: Path | None = None,
        *,
        workdir: Path | None = None,
        controllers: Sequence[str] = ("namespace", "garbagecollector"),
        startup_timeout: float = 90.0,
        users: Sequence[str] = (),
        audit: bool = False,
        scheduler: bool = False,
    ) -> None:
        self.bin_dir = bin_dir or kube_bin_dir()
        self.scheduler = scheduler
        self.users = {u: f"{u}-" + secrets.token_hex(16) for u in users}
        """Extra users (group system:masters), each with its own token: several clients told apart in the audit log."""
        self.audit = audit
        self._own_workdir = workdir is None
        self.workdir = workdir or Path(tempfile.mkdtemp(prefix="reloadd-kube-", dir=_fast_tmp()))
        self.controllers = tuple(controllers)
        self.startup_timeout = startup_timeout
        self.admin_token = "admin-" + secrets.token_hex(16)
        self.restricted_token = "restricted-" + secrets.token_hex(16)
        self.restricted_user = RESTRICTED_USER
        self.restricted_group = RESTRICTED_GROUP
        self.port = 0
        self._procs: dict[str, subprocess.Popen[bytes]] = {}
        self._argv: dict[str, list[str]] = {}
        self._ssl = ssl.create_default_context()

    # --- paths -------------------------------------------------------------------------------------
    @property
    def server(self) -> str:
        """The API server URL, ``https://127.0.0.1:<port>``."""
        return f"https://127.0.0.1:{self.port}"

    @property
    def ssl_context(self) -> ssl.SSLContext:
        """The client TLS context that trusts the API server (for a streaming request, such as a watch)."""
        return self._ssl

    @property
    def ca_file(self) -> Path:
        """The CA certificate that signed the serving certificate."""
        return self.workdir / "pki" / "ca.crt"

    @property
    def kubeconfig(self) -> Path:
        """Kubeconfig for the admin token (``system:masters``)."""
        return self.workdir / "admin.kubeconfig"

    @property
    def restricted_kubeconfig(self) -> Path:
        """Kubeconfig for the restricted token (no RBAC until a test grants some)."""
        return self.workdir / "restricted.kubeconfig"

    @property
    def cert_kubeconfig(self) -> Path:
        """Kubeconfig authenticating with a client certificate (``system:masters``)."""
        return self.workdir / "cert.kubeconfig"

    def kubeconfig_for(self, user: str) -> Path:
        """The kubeconfig of one of the extra ``users``."""
        return self.workdir / f"kubeconfig-{user}"

    @property
    def audit_log(self) -> Path:
        """The API server's audit log (JSON lines), with ``audit=True``."""
        return self.workdir / "audit.log"

    def audit_events(self) -> list[dict[str, Any]]:
        """Every audit event so far (stage ResponseComplete or Panic)."""
        out = []
        try:
            text = self.audit_log.read_text()
        except FileNotFoundError:
            return []
        for line in text.splitlines():
            try:
                event = json.loads(line)
            except ValueError:
                continue  # a line being written
            if event.get("stage") in ("ResponseComplete", "Panic"):
                out.append(event)
        return out

    def log_file(self, component: str) -> Path:
        """The log file of ``etcd``, ``kube-apiserver``, ``kube-controller-manager`` or ``kube-scheduler``."""
        return self.workdir / f"{component}.log"

    # --- lifecycle ---------------------------------------------------------------------------------
    def start(self) -> None:
        """Generate certs, start the three processes and wait until the API server is ready.

        Raises:
            KubeStartError: with the relevant log tail when something did not come up.
        """
        for name in ("kube-apiserver", "kube-controller-manager", *(["kube-scheduler"] if self.scheduler else [])):
            if not os.access(self.bin_dir / name, os.X_OK):
                raise KubeStartError(
                    f"{self.bin_dir / name} missing: run `make kube` (scripts/infra/build-kube-apiserver.sh)"
                )
        if shutil.which("etcd") is None:
            raise KubeStartError("etcd not on PATH: install Debian's etcd-server (make deps)")
        atexit.register(self.stop)  # no orphaned servers if the interpreter exits without teardown
        try:
            self._start()
        except BaseException:
            self.stop()
            raise

    def _start(self) -> None:
        pki = self.workdir / "pki"
        _make_certs(pki)
        etcd_client, etcd_peer, self.port = _free_ports(3)
        (self.workdir / "tokens.csv").write_text(
            f"{self.admin_token},admin,uid-admin,system:masters\n"
            f'{self.restricted_token},{RESTRICTED_USER},uid-{RESTRICTED_USER},"{RESTRICTED_GROUP}"\n'
            + "".join(f"{token},{user},uid-{user},system:masters\n" for user, token in self.users.items())
        )
        audit_flags: list[str] = []
        if self.audit:
            policy = self.workdir / "audit-policy.yaml"
            policy.write_text("apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [RequestReceived]\n"
                              "rules:\n  - level: Metadata\n")
            audit_flags = [f"--audit-policy-file={policy}", f"--audit-log-path={self.audit_log}",
                           "--audit-log-format=json", "--audit-log-mode=blocking"]
        self._spawn("etcd", [
            "etcd", "--name=default", f"--data-dir={self.workdir / 'etcd'}",
            f"--listen-client-urls=http://127.0.0.1:{etcd_client}",
            f"--advertise-client-urls=http://127.0.0.1:{etcd_client}",
            f"--listen-peer-urls=http://127.0.0.1:{etcd_peer}",
            f"--initial-advertise-peer-urls=http://127.0.0.1:{etcd_peer}",
            f"--initial-cluster=default=http://127.0.0.1:{etcd_peer}",
            "--log-level=warn",
        ])
        self._spawn("kube-apiserver", [
            str(self.bin_dir / "kube-apiserver"),
            f"--etcd-servers=http://127.0.0.1:{etcd_client}",
            "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1",
            f"--secure-port={self.port}", "--insecure-port=0",
            f"--tls-cert-file={pki / 'apiserver.crt'}", f"--tls-private-key-file={pki / 'apiserver.key'}",
            f"--client-ca-file={pki / 'ca.crt'}", f"--token-auth-file={self.workdir / 'tokens.csv'}",
            "--authorization-mode=RBAC",
            "--service-account-issuer=https://kubernetes.default.svc",
            f"--service-account-key-file={pki / 'sa.pub'}",
            f"--service-account-signing-key-file={pki / 'sa.key'}",
            "--service-cluster-ip-range=10.0.0.0/16",
            "--disable-admission-plugins=ServiceAccount", "--allow-privileged=true",
            "--endpoint-reconciler-type=none", "--profiling=false", "-v=1", *audit_flags,
        ])
        self.kubeconfig.write_text(_kubeconfig(self.server, self.ca_file, {"token": self.admin_token}))
        self.restricted_kubeconfig.write_text(
            _kubeconfig(self.server, self.ca_file, {"token": self.restricted_token})
        )
        for user, token in self.users.items():
            self.kubeconfig_for(user).write_text(_kubeconfig(self.server, self.ca_file, {"token": token}))
        self.cert_kubeconfig.write_text(_kubeconfig(self.server, self.ca_file, {
            "client-certificate": str(pki / "admin.crt"), "client-key": str(pki / "admin.key"),
        }))
        self._ssl = ssl.create_default_context(cafile=str(self.ca_file))
        self._wait_ready()
        if self.controllers:
            self._spawn("kube-controller-manager", [
                str(self.bin_dir / "kube-controller-manager"),
                f"--kubeconfig={self.kubeconfig}", f"--controllers={','.join(self.controllers)}",
                "--leader-elect=false", "--port=0", "--secure-port=0", "--profiling=false",
            ])
        if self.scheduler:
            self._spawn("kube-scheduler", [
                str(self.bin_dir / "kube-scheduler"), f"--kubeconfig={self.kubeconfig}",
                "--leader-elect=false", "--port=0", "--secure-port=0", "--profiling=false",
            ])

    def restart_apiserver(self) -> None:
        """Kill kube-apiserver (a crash, or a node reboot) and start it again on the same port.

        Every watch it served ends; its watch cache starts afresh from etcd. (A SIGTERM would wait for
        in-flight requests, which a test that holds the event loop never lets finish.)
        """
        proc = self._procs.pop("kube-apiserver")
        proc.kill()
        proc.wait(timeout=30)
        self._spawn("kube-apiserver", self._argv["kube-apiserver"])
        self._wait_ready()

    def _spawn(self, name: str, argv: list[str]) -> None:
        self._argv[name] = argv
        with open(self.log_file(name), "ab") as log:
            self._procs[name] = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                cwd=self.workdir, start_new_session=True,
            )

    def _tail(self, name: str, lines: int = 30) -> str:
        return log_tail(self.log_file(name), lines)

    def _check_alive(self) -> None:
        for name, proc in self._procs.items():
            if proc.poll() is not None:
                raise KubeStartError(f"{name} exited with {proc.returncode}:\n{self._tail(name)}")

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.startup_timeout
        last = ""
        while time.monotonic() < deadline:
            self._check_alive()
            try:
                status, body = self.request("GET", "/readyz")
                if status == 200:
                    return
                last = f"{status} {body}"
            except OSError as exc:
                last = str(exc)
            time.sleep(0.1)  # polling an HTTP readiness endpoint: there is no event to await
        raise KubeStartError(
            f"kube-apiserver not ready after {self.startup_timeout}s ({last}):\n"
            + self._tail("kube-apiserver")
        )

    def assert_running(self) -> None:
        """Raise :class:`KubeStartError` if a component died (call between tests)."""
        self._check_alive()

    def stop(self) -> None:
        """Stop the processes (scheduler and controller manager first, etcd last) and remove the temp dir."""
        atexit.unregister(self.stop)
        for name in ("kube-scheduler", "kube-controller-manager", "kube-apiserver", "etcd"):
            terminate(self._procs.pop(name, None))
        if self._own_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> KubeCluster:
        self.start()
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    async def __aenter__(self) -> KubeCluster:
        await asyncio.to_thread(self.start)
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        await asyncio.to_thread(self.stop)

    # --- a tiny synchronous client for test setup and assertions -----------------------------------
    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        token: str | None = None,
        content_type: str = "application/json",
        timeout: float = 30.0,
    ) -> tuple[int, Any]:
        """Send one request as admin (or ``token``); return ``(status, parsed JSON or text)``.

        HTTP error statuses are returned, not raised. ``body`` is JSON-encoded unless it is bytes/str.
        """
        data: bytes | None
        if body is None:
            data = None
        elif isinstance(body, bytes):
            data = body
        elif isinstance(body, str):
            data = body.encode()
        else:
            data = json.dumps(body).encode()
        req = urllib.request.Request(self.server + path, data=data, method=method)
        req.add_header("Authorization", f"Bearer {token or self.admin_token}")
        req.add_header("Accept", "application/json")
        if data is not None:
            req.add_header("Content-Type", content_type)
        try:
            with urllib.request.urlopen(req, context=self._ssl, timeout=timeout) as resp:
                status, raw = resp.status, resp.read()
        except urllib.error.HTTPError as exc:
            status, raw = exc.code, exc.read()
        try:
            return status, json.loads(raw)
        except ValueError:
            return status, raw.decode(errors="replace")

    def get(self, path: str) -> Any:
        """GET ``path`` as admin; the parsed object, or ``None`` on 404."""
        status, body = self.request("GET", path)
        if status == 404:
            return None
        if status != 200:
            raise AssertionError(f"GET {path}: {status} {body}")
        return body

    def apply(self, obj: dict[str, Any], path: str, *, manager: str = "test", force: bool = True) -> Any:
        """Server-side apply ``obj`` at object URL ``path`` as admin with field manager ``manager``."""
        q = f"?fieldManager={manager}" + ("&force=true" if force else "")
        status, body = self.request("PATCH", path + q, obj, content_type="application/apply-patch+yaml")
        if status not in (200, 201):
            raise AssertionError(f"apply {path}: {status} {body}")
        return body


def _fast_tmp() -> str | None:
    """``/dev/shm`` when usable and roomy (etcd preallocates 64 MB WAL files), else the default temp dir.

    etcd fsyncs on every write, which dominates test time on slow disks.
    """
    shm = Path("/dev/shm")
    try:
        st = os.statvfs(shm)
    except OSError:
        return None
    roomy = st.f_bavail * st.f_frsize >= 1 << 30
    return str(shm) if roomy and os.access(shm, os.W_OK) else None


@contextlib.asynccontextmanager
async def kube_cluster(
    bin_dir: Path | None = None,
    *,
    controllers: Sequence[str] = ("namespace", "garbagecollector"),
    startup_timeout: float = 90.0,
) -> AsyncIterator[KubeCluster]:
    """Async context manager: a started :class:`KubeCluster`, stopped on exit."""
    cluster = KubeCluster(bin_dir, controllers=controllers, startup_timeout=startup_timeout)
    async with cluster:
        yield cluster
