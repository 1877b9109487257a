"""Read every input at once (the I/O edge) and evaluate it (pure).

The consumer is level-triggered: whatever path changed, :func:`read_snapshot` reads the
main file, every ``*.conf`` drop-in (lexical order, as ``filepath.WalkDir`` gives them),
the optional registries.yaml and the containers-certs.d directories, and
:func:`evaluate` turns that snapshot into rendered files or per-file errors.
"""

from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

from ._hosts import is_valid_host
from ._merge import merge
from ._model import Diagnostic, FileConfig, InputError
from ._render import CertFiles, Rendered, render
from ._validate import load_file
from ._yaml import YamlConfig, load_yaml

__all__ = ["FOLLOW_INSIDE", "FOLLOW_ROOT_OWNED", "Inputs", "Outcome", "Snapshot", "evaluate", "read_snapshot"]

FOLLOW_INSIDE = "inside"
"""Symlinked drop-ins are read only when they resolve inside the drop-in folder (the default)."""
FOLLOW_ROOT_OWNED = "root-owned"
"""Also read drop-ins that resolve elsewhere when every link on the way and the file are root's (NixOS)."""
_MAX_HOPS = 40  # Linux's MAXSYMLINKS


@dataclass(frozen=True, slots=True)
class Inputs:
    """Where the inputs live.

    Attributes:
        main: registries.conf (absent is fine).
        conf_d: registries.conf.d (absent is fine).
        yaml: A k3s-style registries.yaml, or ``None``.
        certs_dirs: containers-certs.d roots, first match per host wins.
        max_file_size: Inputs larger than this are rejected unread.
        follow_symlinks: :data:`FOLLOW_INSIDE` or :data:`FOLLOW_ROOT_OWNED`, for symlinked drop-ins.
    """

    main: Path
    conf_d: Path
    yaml: Path | None = None
    certs_dirs: tuple[Path, ...] = ()
    max_file_size: int = 1 << 20
    follow_symlinks: str = FOLLOW_INSIDE


@dataclass(slots=True)
class Snapshot:
    """Everything read in one pass."""

    main: bytes | None = None
    drop_ins: list[tuple[Path, bytes]] = field(default_factory=list)
    yaml: bytes | None = None
    certs: dict[str, CertFiles] = field(default_factory=dict)
    errors: list[Diagnostic] = field(default_factory=list)
    warnings: list[Diagnostic] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Outcome:
    """The result of :func:`evaluate`: rendered files, or errors by input file."""

    rendered: Rendered | None
    errors: dict[Path, list[Diagnostic]]
    inputs: tuple[Path, ...]


def _outside_link_problem(path: Path, target: Path, inside: Path, follow: str) -> str | None:
    """Why the drop-in ``path``, a symlink resolving to ``target`` outside ``inside``, is refused.

    Under :data:`FOLLOW_ROOT_OWNED` every link of the chain must be owned by root, so only
    root can point the drop-in elsewhere; the file itself is checked once opened.
    """
    if follow != FOLLOW_ROOT_OWNED:
        return f"symlink points outside {inside} (to {target}); refused"
    hop = path
    for _ in range(_MAX_HOPS):
        st = os.lstat(hop)
        if not stat.S_ISLNK(st.st_mode):
            return None
        if st.st_uid != 0:
            return f"symlink {hop} (on the way to {target}) is owned by uid {st.st_uid}, not root; refused"
        hop = hop.parent / os.readlink(hop)
    return f"more than {_MAX_HOPS} symlinks on the way to {target}; refused"


def _read(
    path: Path, limit: int, errors: list[Diagnostic], *, inside: Path | None = None, follow: str = FOLLOW_INSIDE
) -> bytes | None:
    """Read a regular file of at most ``limit`` bytes; ``None`` when it does not exist."""
    root_only = False
    try:
        if inside is not None and path.is_symlink():
            target = path.resolve()
            if not target.is_relative_to(inside.resolve()):
                problem = _outside_link_problem(path, target, inside, follow)
                if problem is not None:
                    errors.append(Diagnostic(path, "", problem))
                    return None
                root_only = True
        # O_NONBLOCK: a FIFO dropped in as x.conf must not hang the reader; it is refused below.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        with open(fd, "rb") as f:
            st = os.fstat(f.fileno())
            if not stat.S_ISREG(st.st_mode):
                errors.append(Diagnostic(path, "", "not a regular file (FIFO, socket or device); refused"))
                return None
            if root_only and st.st_uid != 0:
                owner = f"symlink target {path.resolve()} is owned by uid {st.st_uid}, not root; refused"
                errors.append(Diagnostic(path, "", owner))
                return None
            if st.st_size > limit:
                errors.append(Diagnostic(path, "", f"file too large: {st.st_size} bytes, limit {limit}"))
                return None
            data = f.read(limit + 1)
    except FileNotFoundError:
        return None
    except OSError as exc:
        errors.append(Diagnostic(path, "", f"cannot read: {exc.strerror or exc}"))
        return None
    if len(data) > limit:
        errors.append(Diagnostic(path, "", f"file too large: more than {limit} bytes"))
        return None
    return data


def read_snapshot(inputs: Inputs) -> Snapshot:
    """Read all inputs (blocking; run it in a thread)."""
    snap = Snapshot()
    snap.main = _read(inputs.main, inputs.max_file_size, snap.errors)
    try:
        # Directories are skipped, as containers/image's WalkDir does (a symlink to one is not).
        entries = os.scandir(inputs.conf_d)
        names = sorted(e.name for e in entries if e.name.endswith(".conf") and not e.is_dir(follow_symlinks=False))
    except (FileNotFoundError, NotADirectoryError):
        names = []
    except OSError as exc:
        snap.errors.append(Diagnostic(inputs.conf_d, "", f"cannot list: {exc.strerror or exc}"))
        names = []
    for name in names:
        path = inputs.conf_d / name
        data = _read(path, inputs.max_file_size, snap.errors, inside=inputs.conf_d, follow=inputs.follow_symlinks)
        if data is not None:
            snap.drop_ins.append((path, data))
    if inputs.yaml is not None:
        snap.yaml = _read(inputs.yaml, inputs.max_file_size, snap.errors)
    for root in reversed(inputs.certs_dirs):  # earlier roots override later ones
        snap.certs.update(_scan_certs(root, snap.warnings))
    return snap


def _scan_certs(root: Path, warnings: list[Diagnostic]) -> dict[str, CertFiles]:
    found: dict[str, CertFiles] = {}
    try:
        hosts = sorted(e.name for e in os.scandir(root) if e.is_dir() and is_valid_host(e.name))
    except OSError as exc:
        if exc.errno not in (errno.ENOENT, errno.ENOTDIR):
            warnings.append(Diagnostic(root, "", f"cannot list certificates: {exc.strerror or exc}"))
        return found
    for host in hosts:
        d = root / host
        try:
            names = sorted(e.name for e in os.scandir(d) if e.is_file())
        except OSError:
            continue
        ca = tuple(str(d / n) for n in names if n.endswith(".crt"))
        client = []
        for n in names:
            if n.endswith(".cert"):
                key = n[: -len(".cert")] + ".key"
                if key in names:
                    client.append((str(d / n), str(d / key)))
                else:
                    warnings.append(Diagnostic(d / n, "", f"missing key {key} for client certificate; skipped"))
        if ca or client:
            found[host] = CertFiles(ca, tuple(client))
    return found


def evaluate(inputs: Inputs, snap: Snapshot) -> Outcome:
    """Validate, merge and render a snapshot (pure)."""
    errors: dict[Path, list[Diagnostic]] = {}

    def fail(exc_or_diags: InputError | list[Diagnostic]) -> None:
        diags = exc_or_diags.diagnostics if isinstance(exc_or_diags, InputError) else exc_or_diags
        for d in diags:
            errors.setdefault(d.path, []).append(d)

    fail(snap.errors)
    main: FileConfig | None = None
    if snap.main is not None:
        try:
            main = load_file(inputs.main, snap.main, drop_in=False)
        except InputError as exc:
            fail(exc)
    drop_ins = []
    for path, data in snap.drop_ins:
        try:
            drop_ins.append(load_file(path, data, drop_in=True))
        except InputError as exc:
            fail(exc)
    yaml_config: YamlConfig | None = None
    if inputs.yaml is not None and snap.yaml is not None:
        try:
            yaml_config = load_yaml(inputs.yaml, snap.yaml)
        except InputError as exc:
            fail(exc)
    read = ([inputs.main] if snap.main is not None else []) + [p for p, _ in snap.drop_ins]
    if inputs.yaml is not None and snap.yaml is not None:
        read.append(inputs.yaml)
    if errors:
        return Outcome(None, errors, tuple(read))
    rendered = render(merge(main, drop_ins), yaml_config, snap.certs)
    if snap.warnings:
        rendered = Rendered(rendered.files, rendered.origins, (*rendered.warnings, *snap.warnings))
    return Outcome(rendered, errors, tuple(read))
