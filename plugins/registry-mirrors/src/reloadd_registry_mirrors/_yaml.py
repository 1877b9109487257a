"""k3s-style ``registries.yaml``: ``mirrors`` (endpoints per registry) and ``configs`` (TLS per host).

Only what stock containerd can express is kept: endpoints (in order) and TLS files.
``rewrite`` needs k3s's patched containerd, so a mirror with rewrites is skipped with a
warning rather than rendered without them (which would widen it); ``auth`` belongs
to the kubelet or config.toml, not hosts.toml, and is ignored with a warning.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

from ._hosts import is_valid_host
from ._model import Diagnostic, InputError

__all__ = ["YamlConfig", "YamlEndpoint", "YamlMirror", "YamlTLS", "load_yaml"]


@dataclass(frozen=True, slots=True)
class YamlEndpoint:
    """A mirror endpoint: scheme, host[:port] and path (``""`` when containerd adds ``/v2``)."""

    scheme: str
    host: str
    path: str = ""


@dataclass(frozen=True, slots=True)
class YamlMirror:
    """``mirrors.<host>``: its endpoints in order; ``host`` is ``"*"`` for every registry."""

    host: str
    endpoints: tuple[YamlEndpoint, ...]
    entry: str


@dataclass(frozen=True, slots=True)
class YamlTLS:
    """``configs.<host>.tls``."""

    ca_file: str = ""
    cert_file: str = ""
    key_file: str = ""
    insecure_skip_verify: bool = False


@dataclass(frozen=True, slots=True)
class YamlConfig:
    """A validated registries.yaml."""

    path: Path
    mirrors: tuple[YamlMirror, ...] = ()
    tls: Mapping[str, YamlTLS] = field(default_factory=dict)
    warnings: tuple[Diagnostic, ...] = ()


def load_yaml(path: Path, data: bytes) -> YamlConfig:
    """Parse and validate a registries.yaml.

    Raises:
        InputError: invalid YAML, wrong types, or a host that is not a valid ``host[:port]``.
    """
    try:
        doc = yaml.safe_load(data.decode("utf-8")) or {}
    except (UnicodeDecodeError, yaml.YAMLError) as exc:
        raise InputError.at(path, "", f"invalid YAML: {exc}") from exc
    r = _Reading(path)
    top = r.table(doc, "", ("mirrors", "configs"))
    mirrors = _mirrors(r, top.get("mirrors"))
    tls = _configs(r, top.get("configs"))
    if r.errors:
        raise InputError(r.errors)
    return YamlConfig(path, tuple(mirrors), tls, tuple(r.warnings))


class _Reading:
    """The errors and warnings found so far in one file (every error is reported, not only the first)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.errors: list[Diagnostic] = []
        self.warnings: list[Diagnostic] = []

    def error(self, entry: str, message: str) -> None:
        self.errors.append(Diagnostic(self.path, entry, message))

    def warn(self, entry: str, message: str) -> None:
        self.warnings.append(Diagnostic(self.path, entry, message))

    def table(self, value: Any, entry: str, known: tuple[str, ...] | None) -> dict[str, Any]:
        """``value`` as a mapping with string keys (``{}`` when absent or not one); unknown keys warned about."""
        if value is None:
            return {}
        if not isinstance(value, dict):
            self.error(entry, f"must be a mapping, got {type(value).__name__}")
            return {}
        if known is not None:
            for key in value:
                if key not in known:
                    self.warn(entry, f"unknown key {key!r} is ignored")
        return {str(k): v for k, v in value.items()}


def _mirrors(r: _Reading, value: Any) -> list[YamlMirror]:
    """``mirrors``: the endpoints of each registry, in order and without repeats (rewrites skipped)."""
    mirrors = []
    for host, spec in r.table(value, "mirrors", None).items():
        entry = f"mirrors.{host!r}"
        if host != "*" and not is_valid_host(host):
            r.error(entry, f"{host!r} is not a valid registry host[:port]")
            continue
        body = r.table(spec, entry, ("endpoint", "rewrite"))
        if body.get("rewrite"):
            r.warn(entry, "rewrite needs k3s's patched containerd; mirror skipped, not widened")
            continue
        raw_endpoints = body.get("endpoint") or []
        if not isinstance(raw_endpoints, list):
            r.error(f"{entry}.endpoint", "must be a list of URLs")
            continue
        endpoints = []
        for i, raw in enumerate(raw_endpoints):
            ep = _endpoint(raw, r.path, f"{entry}.endpoint[{i}]", r.errors)
            if ep is not None and ep not in endpoints:
                endpoints.append(ep)
        if endpoints:
            mirrors.append(YamlMirror(host, tuple(endpoints), entry))
    return mirrors


def _configs(r: _Reading, value: Any) -> dict[str, YamlTLS]:
    """``configs``: the TLS files of each host (``auth`` warned about and ignored)."""
    tls: dict[str, YamlTLS] = {}
    for host, spec in r.table(value, "configs", None).items():
        entry = f"configs.{host!r}"
        if not is_valid_host(host):
            r.error(entry, f"{host!r} is not a valid registry host[:port]")
            continue
        body = r.table(spec, entry, ("auth", "tls"))
        if body.get("auth"):
            r.warn(f"{entry}.auth", "credentials are not written to hosts.toml (use kubelet pull secrets); ignored")
        tls[host] = _tls(r, body.get("tls"), entry)
    return tls


def _tls(r: _Reading, value: Any, entry: str) -> YamlTLS:
    """``configs.<host>.tls``: file names as strings, ``insecure_skip_verify`` a boolean, cert and key together."""
    t = r.table(value, f"{entry}.tls", ("ca_file", "cert_file", "key_file", "insecure_skip_verify"))
    values: dict[str, Any] = {}
    for key in ("ca_file", "cert_file", "key_file"):
        v = t.get(key, "")
        if not isinstance(v, str):
            r.error(f"{entry}.tls.{key}", f"must be a string, got {v!r}")
        values[key] = v if isinstance(v, str) else ""
    skip = t.get("insecure_skip_verify", False)
    if not isinstance(skip, bool):
        r.error(f"{entry}.tls.insecure_skip_verify", f"must be a boolean, got {skip!r}")
        skip = False
    if bool(values["cert_file"]) != bool(values["key_file"]):
        r.error(f"{entry}.tls", "cert_file and key_file must be set together")
    return YamlTLS(insecure_skip_verify=skip, **values)


def _endpoint(raw: Any, path: Path, entry: str, errors: list[Diagnostic]) -> YamlEndpoint | None:
    if not isinstance(raw, str) or not raw:
        errors.append(Diagnostic(path, entry, f"must be a URL string, got {raw!r}"))
        return None
    url = raw if "://" in raw else f"https://{raw}"
    try:
        parts = urlsplit(url)
    except ValueError as exc:
        errors.append(Diagnostic(path, entry, f"invalid URL {raw!r}: {exc}"))
        return None
    if parts.scheme not in ("http", "https") or not is_valid_host(parts.netloc):
        errors.append(Diagnostic(path, entry, f"invalid endpoint {raw!r}: want http(s)://host[:port][/path]"))
        return None
    if parts.query or parts.fragment:
        errors.append(Diagnostic(path, entry, f"invalid endpoint {raw!r}: no query or fragment allowed"))
        return None
    endpoint_path = parts.path.rstrip("/")
    if endpoint_path == "/v2":
        endpoint_path = ""
    return YamlEndpoint(parts.scheme, parts.netloc, endpoint_path)
