"""Where the API server is and how to authenticate: kubeconfig files and in-cluster service accounts.

Semantics follow kubectl (client-go's loader):

* Precedence: the explicit ``kubeconfig`` option, else ``$KUBECONFIG``, else ``~/.kube/config``; the
  in-cluster service account only when none of those yields a kubeconfig (client-go's
  ``DeferredLoadingClientConfig``), so a kubeconfig mounted into a pod wins over its service account.
* ``$KUBECONFIG`` may list several files: they are merged, the first file to define a cluster, user or
  context by name wins, ``current-context`` comes from the first file that sets one, missing files are
  skipped, and relative paths resolve against the file that holds them.
* Trust: when the cluster names a CA (file or data), that CA alone is trusted, not the system store; with
  no CA, the system store is used.
* Credentials: bearer tokens (inline or ``tokenFile``), client certificates (files or inline data; inline
  key material is handed to OpenSSL through an anonymous memory file and never written to disk), exec
  credential plugins (``client.authentication.k8s.io`` v1 / v1beta1) returning a token and/or a client
  certificate and key, ``insecure-skip-tls-verify`` (refused beside a CA, as client-go refuses it).
  In-cluster, the projected service-account token is re-read when it changes, because kubelet rotates
  it. Auth-provider plugins (gcp/azure/oidc) are not supported: they were removed from client-go and
  exec plugins replaced them.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import ssl
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import aiofiles
import aiofiles.os
import yaml

from reloadd import CommandError, ConfigError, TransientError, run_command

__all__ = ["Auth", "ClusterConfig", "ExecAuth", "TokenAuth", "TokenFileAuth", "load_cluster_config"]

SA_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
_TOKEN_RECHECK = 60.0  # seconds between stat checks of a token file
_EXEC_TIMEOUT = 60.0


class Auth:
    """Supplies the ``Authorization`` header; subclasses refresh credentials as needed."""

    async def header(self) -> str | None:
        """The header value, or ``None`` for certificate-only or anonymous auth."""
        return None

    def invalidate(self) -> None:
        """Forget cached credentials (called after a 401) so the next call reloads them."""


@dataclass
class TokenAuth(Auth):
    """A fixed bearer token."""

    token: str

    async def header(self) -> str | None:
        """``Bearer <token>``."""
        return f"Bearer {self.token}"


@dataclass
class TokenFileAuth(Auth):
    """A bearer token read from a file and re-read when the file changes (rotated SA tokens)."""

    path: Path
    _token: str | None = None
    _mtime: int = -1
    _checked: float = 0.0

    async def header(self) -> str | None:
        """``Bearer <token>`` from the file's current content."""
        now = time.monotonic()
        if self._token is None or now - self._checked > _TOKEN_RECHECK:
            self._checked = now
            try:
                mtime = (await aiofiles.os.stat(self.path)).st_mtime_ns
                if self._token is None or mtime != self._mtime:
                    async with aiofiles.open(self.path) as f:
                        self._token = (await f.read()).strip()
                    self._mtime = mtime
            except OSError as exc:
                raise TransientError(f"cannot read token file {self.path}: {exc}") from exc
        return f"Bearer {self._token}"

    def invalidate(self) -> None:
        """Re-read the file on next use."""
        self._token = None


@dataclass
class ExecAuth(Auth):
    """An exec credential plugin; its credentials are cached until ``expirationTimestamp``.

    The plugin may return a token, a client certificate and key (loaded into ``tls``, the
    connection's TLS context, so new connections present them), or both.
    """

    command: str
    args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    api_version: str = "client.authentication.k8s.io/v1"
    cwd: Path | None = None
    tls: ssl.SSLContext | None = None
    _token: str | None = None
    _fresh: bool = False
    _expires: float | None = None
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    async def header(self) -> str | None:
        """``Bearer <token>`` (None for certificate-only credentials), running the plugin when needed."""
        async with self._lock:
            if not self._fresh or (self._expires is not None and time.time() > self._expires - 10):
                await self._run()
        return f"Bearer {self._token}" if self._token else None

    def invalidate(self) -> None:
        """Run the plugin again on next use."""
        self._fresh = False

    async def _run(self) -> None:
        info = {"apiVersion": self.api_version, "kind": "ExecCredential", "spec": {"interactive": False}}
        env = {**os.environ, **self.env, "KUBERNETES_EXEC_INFO": json.dumps(info)}
        try:  # the core's runner: on a timeout the plugin's whole process group is killed, not left behind
            ran = await run_command([self.command, *self.args], timeout=_EXEC_TIMEOUT, env=env,
                                    cwd=self.cwd, capture="stdout")
        except CommandError as exc:
            raise TransientError(f"exec credential plugin {self.command!r} failed: {exc}") from exc
        out = ran.output
        if ran.returncode != 0:
            raise TransientError(
                f"exec credential plugin {self.command!r} exited {ran.returncode}: "
                f"{ran.errors.decode(errors='replace').strip()[:500]}"
            )
        try:
            status = json.loads(out)["status"]
            if not isinstance(status, Mapping):
                raise TypeError("status is not an object")
        except (ValueError, KeyError, TypeError) as exc:
            raise TransientError(f"exec credential plugin {self.command!r} returned no status: {exc}") from exc
        token = status.get("token")
        cert, key = status.get("clientCertificateData"), status.get("clientKeyData")
        if not token and not (cert and key):
            raise TransientError(
                f"exec credential plugin {self.command!r} returned neither status.token nor "
                "status.clientCertificateData with status.clientKeyData"
            )
        if cert and key:
            if self.tls is None:
                raise TransientError(
                    f"exec credential plugin {self.command!r} returned a client certificate for a plain-HTTP server"
                )
            try:
                _load_cert_chain(self.tls, str(cert).encode(), str(key).encode())
            except (OSError, ssl.SSLError) as exc:
                raise TransientError(
                    f"exec credential plugin {self.command!r} returned an unusable client certificate: {exc}"
                ) from exc
        self._token = str(token) if token else None
        self._fresh = True
        exp = status.get("expirationTimestamp")
        self._expires = datetime.fromisoformat(str(exp).replace("Z", "+00:00")).timestamp() if exp else None


@dataclass
class ClusterConfig:
    """A resolved connection: server URL, TLS context and credentials.

    Attributes:
        server: Base URL such as ``https://10.0.0.1:443`` (no trailing slash).
        ssl: TLS context (CA, client certificate) or ``None`` for plain HTTP.
        auth: Credentials for the ``Authorization`` header.
        namespace: The namespace the kubeconfig context (or service account) defaults to.
        server_hostname: Overrides the TLS server name (kubeconfig ``tls-server-name``).
    """

    server: str
    ssl: ssl.SSLContext | None
    auth: Auth
    namespace: str = "default"
    server_hostname: str | None = None


def _memory_file(data: bytes) -> int:
    """An anonymous in-memory file holding ``data`` (never on disk); the caller closes it."""
    fd = os.memfd_create("reloadd-kube-credential", os.MFD_CLOEXEC)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    except BaseException:
        os.close(fd)
        raise
    return fd


def _load_cert_chain(ctx: ssl.SSLContext, cert: bytes | str, key: bytes | str | None) -> None:
    """Load a client certificate and key, each PEM bytes or a file path, into ``ctx``.

    OpenSSL loads certificates only by path; in-memory material goes through ``/proc/self/fd`` of
    an anonymous memory file, so no key is ever written to the filesystem.
    """
    fds: list[int] = []

    def path(x: bytes | str | None) -> str | None:
        if x is None or isinstance(x, str):
            return x
        fds.append(_memory_file(x))
        return f"/proc/self/fd/{fds[-1]}"

    try:
        cert_path = path(cert)
        assert cert_path is not None
        ctx.load_cert_chain(cert_path, path(key))
    finally:
        for fd in fds:
            os.close(fd)


def _b64(data: str, what: str) -> bytes:
    try:
        return base64.b64decode(data, validate=True)
    except ValueError as exc:
        raise ValueError(f"{what} is not valid base64") from exc


def _ssl_context(
    ca_file: str | None, ca_data: str | None, insecure: bool,
    cert_file: str | None, cert_data: str | None, key_file: str | None, key_data: str | None,
) -> ssl.SSLContext:
    """A client TLS context as client-go builds it: the kubeconfig's CA alone, else the system store."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    if ca_data:
        ctx.load_verify_locations(cadata=_b64(ca_data, "certificate-authority-data").decode())
    elif ca_file:
        ctx.load_verify_locations(cafile=ca_file)
    else:
        ctx.load_default_certs(ssl.Purpose.SERVER_AUTH)
    if insecure:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    cert: bytes | str | None = _b64(cert_data, "client-certificate-data") if cert_data else cert_file
    key: bytes | str | None = _b64(key_data, "client-key-data") if key_data else key_file
    if cert:
        _load_cert_chain(ctx, cert, key)
    return ctx


def _read_doc(path: Path) -> Mapping[str, Any]:
    try:
        doc = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"cannot read kubeconfig {path}: {exc}") from exc
    if doc is None:
        return {}
    if not isinstance(doc, Mapping):
        raise ConfigError(f"kubeconfig {path}: not a mapping")
    return doc


@dataclass
class _Merged:
    """Several kubeconfig files merged the way client-go merges ``$KUBECONFIG``: first definition wins."""

    files: list[Path] = field(default_factory=list)
    current_context: str | None = None
    entries: dict[str, dict[str, tuple[Mapping[str, Any], Path]]] = field(
        default_factory=lambda: {"clusters": {}, "users": {}, "contexts": {}}
    )

    def add(self, path: Path) -> None:
        doc = _read_doc(path)
        self.files.append(path)
        if not self.current_context and doc.get("current-context"):
            self.current_context = str(doc["current-context"])
        for kind, table in self.entries.items():
            for item in doc.get(kind) or ():
                if not isinstance(item, Mapping) or not item.get("name"):
                    continue
                value = item.get(kind.rstrip("s")) or {}
                if isinstance(value, Mapping):
                    table.setdefault(str(item["name"]), (value, path))

    def where(self) -> str:
        return ", ".join(map(str, self.files))

    def empty(self) -> bool:
        """Nothing defined at all: client-go's "empty config", which lets in-cluster config take over."""
        return not self.current_context and not any(self.entries.values())

    def named(self, kind: str, name: str) -> tuple[Mapping[str, Any], Path]:
        try:
            return self.entries[kind][name]
        except KeyError:
            raise ConfigError(f"kubeconfig {self.where()}: no {kind.rstrip('s')} named {name!r}") from None


def _merge(paths: list[Path]) -> _Merged:
    merged = _Merged()
    for p in paths:
        merged.add(p)
    return merged


def _load_kubeconfig(merged: _Merged, context: str | None) -> ClusterConfig:
    where = merged.where()
    ctx_name = context or merged.current_context
    if not ctx_name:
        raise ConfigError(f"kubeconfig {where}: no current-context")
    ctx, _ = merged.named("contexts", str(ctx_name))
    cluster, cluster_file = merged.named("clusters", str(ctx.get("cluster")))
    user, user_file = merged.named("users", str(ctx["user"])) if ctx.get("user") else ({}, cluster_file)

    def rel(p: Any, base: Path) -> str | None:
        return str(base.parent / str(p)) if p else None

    server = str(cluster.get("server") or "").rstrip("/")
    if not server:
        raise ConfigError(f"kubeconfig {where}: cluster {ctx.get('cluster')!r} has no server")
    if cluster.get("insecure-skip-tls-verify") and (
        cluster.get("certificate-authority") or cluster.get("certificate-authority-data")
    ):
        # client-go refuses this pair (transport.TLSConfigFor) rather than silently dropping the CA:
        # a kubeconfig that names a CA expects it to be checked.
        raise ConfigError(
            f"kubeconfig {where}: cluster {ctx.get('cluster')!r}: specifying a root certificates file "
            "with the insecure flag is not allowed (insecure-skip-tls-verify with certificate-authority)"
        )
    tls = None
    if server.startswith("https://"):
        try:
            tls = _ssl_context(
                rel(cluster.get("certificate-authority"), cluster_file), cluster.get("certificate-authority-data"),
                bool(cluster.get("insecure-skip-tls-verify")),
                rel(user.get("client-certificate"), user_file), user.get("client-certificate-data"),
                rel(user.get("client-key"), user_file), user.get("client-key-data"),
            )
        except (OSError, ssl.SSLError, ValueError) as exc:
            raise ConfigError(f"kubeconfig {where}: bad TLS material: {exc}") from exc
    auth: Auth
    if user.get("token"):
        auth = TokenAuth(str(user["token"]))
    elif user.get("tokenFile"):
        auth = TokenFileAuth(Path(str(rel(user["tokenFile"], user_file))))
    elif isinstance(user.get("exec"), Mapping):
        ex = user["exec"]
        env = {str(e["name"]): str(e["value"]) for e in ex.get("env") or () if isinstance(e, Mapping)}
        auth = ExecAuth(
            str(ex.get("command")), [str(a) for a in ex.get("args") or ()], env,
            str(ex.get("apiVersion") or "client.authentication.k8s.io/v1"), user_file.parent, tls,
        )
    elif user.get("auth-provider"):
        raise ConfigError(f"kubeconfig {where}: auth-provider is not supported; use an exec plugin")
    else:
        auth = Auth()
    return ClusterConfig(
        server, tls, auth, str(ctx.get("namespace") or "default"), cluster.get("tls-server-name")
    )


def _in_cluster(sa_dir: Path) -> ClusterConfig:
    host, port = os.environ["KUBERNETES_SERVICE_HOST"], os.environ.get("KUBERNETES_SERVICE_PORT", "443")
    if ":" in host:
        host = f"[{host}]"
    try:
        tls = _ssl_context(str(sa_dir / "ca.crt"), None, False, None, None, None, None)
        ns = (sa_dir / "namespace").read_text().strip() if (sa_dir / "namespace").exists() else "default"
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"in-cluster config: {exc}") from exc
    return ClusterConfig(f"https://{host}:{port}", tls, TokenFileAuth(sa_dir / "token"), ns)


def load_cluster_config(
    kubeconfig: Path | None = None, context: str | None = None, *, sa_dir: Path = SA_DIR
) -> ClusterConfig:
    """Resolve the connection in kubectl's (client-go's) order.

    1. ``kubeconfig``, when given (it must exist);
    2. else the files listed in ``$KUBECONFIG`` (missing ones skipped), when the variable is set; a set
       ``$KUBECONFIG`` replaces ``~/.kube/config``, it is not merged with it;
    3. else ``~/.kube/config``;
    4. only when none of those files exists (or what they hold is empty), the in-cluster service
       account (``$KUBERNETES_SERVICE_HOST`` and a token in ``sa_dir``).

    A kubeconfig that is found always wins over the in-cluster account, as client-go's
    ``DeferredLoadingClientConfig`` decides: a pod that mounts an admin kubeconfig means to use it.

    Raises:
        ConfigError: when no configuration is found or it is invalid.
    """
    if kubeconfig is not None:
        return _load_kubeconfig(_merge([kubeconfig]), context)
    env = os.environ.get("KUBECONFIG")
    if env:
        chain = list(dict.fromkeys(Path(p) for p in env.split(os.pathsep) if p))
    else:
        chain = [Path.home() / ".kube" / "config"]
    merged = _merge([p for p in chain if p.exists()])  # client-go skips missing files in the chain
    in_cluster = bool(os.environ.get("KUBERNETES_SERVICE_HOST")) and (sa_dir / "token").is_file()
    if merged.files and not (merged.empty() and in_cluster):
        return _load_kubeconfig(merged, context)
    if in_cluster:
        return _in_cluster(sa_dir)
    looked = "$KUBECONFIG (" + env + ")" if env else "~/.kube/config"
    raise ConfigError(f"no kubeconfig given, none found in {looked}, and not in a cluster")
