"""The consumer's options, validated once at load time."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from reloadd import ConfigError, ConsumerContext, Options

from ._keys import KeyFileError, Keyring, load_keys
from ._oci import parse_platform
from ._policy import MODES

__all__ = ["MAX_CONCURRENCY", "ON_DELETE", "Settings"]

ON_DELETE = ("unpin", "remove", "keep")
MAX_CONCURRENCY = 64
"""The largest ``concurrency``: each import in flight holds a tarball stream and containerd leases."""
DEFAULT_ADDRESS = "/run/containerd/containerd.sock"


@dataclass(frozen=True)
class Settings:
    """Options of a ``containerd-images`` consumer.

    Attributes:
        address: containerd's gRPC socket.
        namespace: Namespace for imported images (CRI's is ``k8s.io``; elsewhere no CRI records are made).
        snapshotter: Snapshotter to unpack into.
        unpack: Unpack the host platform at import, so the first pod start does not pay for it.
        platforms: ``["linux/amd64", ...]``: keep only these (absent: all); missing platform content is
            skipped either way.
        concurrency: Files imported at once.
        pin: Label images ``io.cri-containerd.pinned=pinned`` (kubelet's image GC skips them, containerd
            ≥ 1.7.3; k3s's own ``io.cattle.k3s.pinned`` is not written, add it with ``labels`` if wanted).
        on_delete: When a file goes: ``unpin``, ``remove`` the image records, or ``keep``.
        labels: Extra labels for every image record.
        pull_timeout: Deadline of one CRI PullImage (a ``.txt`` list's line).
        timeout: Deadline of other containerd calls.
        verify: ``off`` | ``warn`` | ``require``: what a file no trusted key vouches for gets (``warn``
            imports it with an UNVERIFIED line, ``require`` refuses it and imports nothing).
        trusted_keys: PEM public keys (ECDSA P-256/P-384, Ed25519, RSA), paths or globs relative to the
            configuration file; read at start and on every reload.
        verify_wait: How long an archive or list without a signature or signed checksum file waits for one
            before ``require`` refuses it.
    """

    address: str = DEFAULT_ADDRESS
    namespace: str = "k8s.io"
    snapshotter: str = "overlayfs"
    unpack: bool = True
    platforms: tuple[Mapping[str, str], ...] | None = None
    concurrency: int = 2
    pin: bool = True
    on_delete: str = "unpin"
    labels: Mapping[str, str] = field(default_factory=dict)
    pull_timeout: float = 600.0
    timeout: float = 60.0
    verify: str = "off"
    """``off`` | ``warn`` | ``require``: what a file no trusted key vouches for gets (see ``_policy``)."""
    trusted_keys: tuple[str, ...] = ()
    """PEM public-key paths or globs, as configured (re-read on every SIGHUP)."""
    keys_base: Path | None = None
    """Where relative ``trusted_keys`` start: the configuration file's folder."""
    keyring: Keyring = field(default_factory=Keyring)
    """The keys read at load time."""
    verify_wait: float = 30.0
    """Seconds an archive or list without evidence waits for its signature or checksum file."""

    @classmethod
    def from_context(cls, ctx: ConsumerContext) -> Settings:
        """Read and check ``ctx.options``.

        Raises:
            ConfigError: naming the consumer and the key.
        """
        where = f"consumer {ctx.name!r} options"
        o = Options(ctx.options, where=where)
        platforms: tuple[Mapping[str, str], ...] | None = None
        if o.has("platforms"):
            specs = o.str_list("platforms")
            try:
                platforms = tuple(parse_platform(p) for p in specs)
            except ValueError as exc:
                raise ConfigError(f"{where}: key 'platforms': {exc}") from exc
            if not platforms:
                raise ConfigError(f"{where}: key 'platforms' must not be empty (omit it for all platforms)")
        labels = o.table("labels")
        for k, v in labels.items():
            if not isinstance(v, str):
                raise ConfigError(f"{where}: key 'labels.{k}' must be a string, got {type(v).__name__}")
        base = ctx.config_file.parent if ctx.config_file else None
        verify = o.choice("verify", MODES, "off")
        patterns = tuple(o.str_list("trusted_keys"))
        try:
            keyring = load_keys(patterns, base)
        except KeyFileError as exc:
            raise ConfigError(f"{where}: key 'trusted_keys': {exc}") from exc
        if verify != "off" and not keyring.keys:
            raise ConfigError(f"{where}: verify = {verify!r} needs 'trusted_keys' (PEM public keys)")
        address = o.path("address", DEFAULT_ADDRESS, base=ctx.config_file.parent if ctx.config_file else None)
        s = cls(
            address=str(address),
            namespace=o.str("namespace", "k8s.io"),
            snapshotter=o.str("snapshotter", "overlayfs"),
            unpack=o.bool("unpack", True),
            platforms=platforms,
            concurrency=o.int("concurrency", 2, minimum=1, maximum=MAX_CONCURRENCY),
            pin=o.bool("pin", True),
            on_delete=o.choice("on_delete", ON_DELETE, "unpin"),
            labels=dict(labels),
            pull_timeout=o.duration("pull_timeout", 600.0),
            timeout=o.duration("timeout", 60.0),
            verify=verify,
            trusted_keys=patterns,
            keys_base=base,
            keyring=keyring,
            verify_wait=o.duration("verify_wait", 30.0, maximum=86400.0),
        )
        o.finish()
        if not s.namespace:
            raise ConfigError(f"{where}: key 'namespace' must not be empty")
        return s
