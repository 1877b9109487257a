"""Where the API server is and how to authenticate: kubeconfig files and in-cluster service accounts.

Supported: bearer tokens (inline or ``tokenFile``), client certificates (files or inline data), exec
credential plugins (``client.authentication.k8s.io`` v1 / v1beta1 returning a token), CA bundles (files or
data) and ``insecure-skip-tls-verify``. In-cluster, the projected service-account token is re-read when it
changes, because kubelet rotates it. Auth-provider plugins (gcp/azure/oidc) are not supported: they were
removed from client-go and exec plugins replaced them.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import ssl
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

from reloadd import ConfigError, TransientError

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
                mtime = self.path.stat().st_mtime_ns
                if self._token is None or mtime != self._mtime:
                    self._token = self.path.read_text().strip()
                    self._mtime = mtime
            except OSError as exc:
                raise TransientError(f"cannot read token file {self.path}: {exc}") from exc
        return f"Bearer {self._token}"

    def invalidate(self) -> None:
        """Re-read the file on next use."""
        self._token = None


@dataclass
class ExecAuth(Auth):
    """An exec credential plugin; its token is cached until ``expirationTimestamp``."""

    command: str
    args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    api_version: str = "client.authentication.k8s.io/v1"
    cwd: Path | None = None
    _token: str | None = None
    _expires: float | None = None
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    async def header(self) -> str | None:
        """``Bearer <token>``, running the plugin when there is no valid cached token."""
        async with self._lock:
            if self._token is None or (self._expires is not None and time.time() > self._expires - 10):
                await self._run()
        return f"Bearer {self._token}"

    def invalidate(self) -> None:
        """Run the plugin again on next use."""
        self._token = None

    async def _run(self) -> None:
        info = {"apiVersion": self.api_version, "kind": "ExecCredential", "spec": {"interactive": False}}
        env = {**os.environ, **self.env, "KUBERNETES_EXEC_INFO": json.dumps(info)}
        try:
            proc = await asyncio.create_subprocess_exec(
                self.command, *self.args, env=env, cwd=self.cwd,
                stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
            out, err = await asyncio.wait_for(proc.communicate(), _EXEC_TIMEOUT)
        except (OSError, TimeoutError) as exc:
            raise TransientError(f"exec credential plugin {self.command!r} failed: {exc}") from exc
        if proc.returncode != 0:
            raise TransientError(
                f"exec credential plugin {self.command!r} exited {proc.returncode}: "
                f"{err.decode(errors='replace').strip()[:500]}"
            )
        try:
            status = json.loads(out)["status"]
            token = status["token"]
        except (ValueError, KeyError, TypeError) as exc:
            raise TransientError(
                f"exec credential plugin {self.command!r} returned no status.token: {exc}"
            ) from exc
        self._token = str(token)
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


def _data_file(data: str, suffix: str) -> str:
    """Write base64 ``data`` to a private temp file (ssl only loads certs from files)."""
    fd, name = tempfile.mkstemp(suffix=suffix)
    with os.fdopen(fd, "wb") as f:
        f.write(base64.b64decode(data))
    return name


def _ssl_context(
    ca_file: str | None, ca_data: str | None, insecure: bool,
    cert_file: str | None, cert_data: str | None, key_file: str | None, key_data: str | None,
) -> ssl.SSLContext:
    temps: list[str] = []
    try:
        ctx = ssl.create_default_context()
        if ca_data:
            ctx.load_verify_locations(cadata=base64.b64decode(ca_data).decode())
        elif ca_file:
            ctx.load_verify_locations(cafile=ca_file)
        if insecure:
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        if cert_data:
            cert_file = _data_file(cert_data, ".crt")
            temps.append(cert_file)
        if key_data:
            key_file = _data_file(key_data, ".key")
            temps.append(key_file)
        if cert_file:
            ctx.load_cert_chain(cert_file, key_file)
        return ctx
    finally:
        for t in temps:
            os.unlink(t)


def _named(items: Any, name: str, what: str, where: Path) -> Mapping[str, Any]:
    for item in items or ():
        if isinstance(item, Mapping) and item.get("name") == name:
            value = item.get(what.rstrip("s")) or {}
            if isinstance(value, Mapping):
                return value
    raise ConfigError(f"kubeconfig {where}: no {what.rstrip('s')} named {name!r}")


def _load_kubeconfig(path: Path, context: str | None) -> ClusterConfig:
    try:
        doc = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"cannot read kubeconfig {path}: {exc}") from exc
    if not isinstance(doc, Mapping):
        raise ConfigError(f"kubeconfig {path}: not a mapping")
    ctx_name = context or doc.get("current-context")
    if not ctx_name:
        raise ConfigError(f"kubeconfig {path}: no current-context")
    ctx = _named(doc.get("contexts"), str(ctx_name), "contexts", path)
    cluster = _named(doc.get("clusters"), str(ctx.get("cluster")), "clusters", path)
    user: Mapping[str, Any] = (
        _named(doc.get("users"), str(ctx["user"]), "users", path) if ctx.get("user") else {}
    )
    base = path.parent

    def rel(p: Any) -> str | None:
        return str(base / str(p)) if p else None

    server = str(cluster.get("server") or "").rstrip("/")
    if not server:
        raise ConfigError(f"kubeconfig {path}: cluster {ctx.get('cluster')!r} has no server")
    try:
        tls = None
        if server.startswith("https://"):
            tls = _ssl_context(
                rel(cluster.get("certificate-authority")), cluster.get("certificate-authority-data"),
                bool(cluster.get("insecure-skip-tls-verify")),
                rel(user.get("client-certificate")), user.get("client-certificate-data"),
                rel(user.get("client-key")), user.get("client-key-data"),
            )
    except (OSError, ssl.SSLError, ValueError) as exc:
        raise ConfigError(f"kubeconfig {path}: bad TLS material: {exc}") from exc
    auth: Auth
    if user.get("token"):
        auth = TokenAuth(str(user["token"]))
    elif user.get("tokenFile"):
        auth = TokenFileAuth(Path(str(rel(user["tokenFile"]))))
    elif isinstance(user.get("exec"), Mapping):
        ex = user["exec"]
        env = {str(e["name"]): str(e["value"]) for e in ex.get("env") or () if isinstance(e, Mapping)}
        auth = ExecAuth(
            str(ex.get("command")), [str(a) for a in ex.get("args") or ()], env,
            str(ex.get("apiVersion") or "client.authentication.k8s.io/v1"), base,
        )
    elif user.get("auth-provider"):
        raise ConfigError(f"kubeconfig {path}: auth-provider is not supported; use an exec plugin")
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
    """Resolve the connection: explicit kubeconfig, else in-cluster, else ``$KUBECONFIG``/``~/.kube/config``.

    Raises:
        ConfigError: when no configuration is found or it is invalid.
    """
    if kubeconfig is not None:
        return _load_kubeconfig(kubeconfig, context)
    if os.environ.get("KUBERNETES_SERVICE_HOST") and (sa_dir / "token").exists():
        return _in_cluster(sa_dir)
    env = os.environ.get("KUBECONFIG")
    candidates = [Path(p) for p in env.split(os.pathsep) if p] if env else []
    candidates.append(Path.home() / ".kube" / "config")
    for cand in candidates:
        if cand.exists():
            return _load_kubeconfig(cand, context)
    raise ConfigError("no kubeconfig given, not in a cluster, and no ~/.kube/config")
