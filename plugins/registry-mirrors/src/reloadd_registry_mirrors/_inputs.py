"""Read every input at once (the I/O edge) and evaluate it (pure).

The consumer is level-triggered: whatever path changed, :func:`read_snapshot` reads the
main file, every ``*.conf`` drop-in (lexical order, as ``filepath.WalkDir`` gives them),
the optional registries.yaml and the containers-certs.d directories, and
:func:`evaluate` turns that snapshot into rendered files or per-file errors.
"""

from __future__ import annotations

import asyncio
import errno
import os
import stat
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import aiofiles

from ._hosts import is_valid_host
from ._links import FOLLOW_INSIDE, FOLLOW_ROOT_OWNED, Refused, open_drop_in
from ._merge import merge
from ._model import Diagnostic, FileConfig, InputError
from ._render import CertFiles, Rendered, render
from ._validate import load_file
from ._yaml import YamlConfig, load_yaml

__all__ = ["FOLLOW_INSIDE", "FOLLOW_ROOT_OWNED", "Inputs", "Outcome", "Snapshot", "evaluate", "read_snapshot"]

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


def _opener(inside: Path | None, follow: str, outside: list[Path]) -> Callable[[str, int], int]:
    """An ``open()`` opener that checks a drop-in's symlinks in the same executor call as the open."""

    def open_checked(name: str, flags: int) -> int:
        # O_NONBLOCK: a FIFO dropped in as x.conf must not hang the reader; it is refused below.
        flags |= os.O_NONBLOCK | os.O_CLOEXEC
        if inside is None:
            return os.open(name, flags)
        return open_drop_in(Path(name), inside, follow, flags, outside)

    return open_checked


async def _read(
    path: Path, limit: int, *, inside: Path | None = None, follow: str = FOLLOW_INSIDE
) -> tuple[bytes | None, list[Diagnostic]]:
    """Read a regular file of at most ``limit`` bytes through aiofiles; ``None`` when it does not exist or fails."""
    outside: list[Path] = []  # a symlink target outside ``inside``: read only if root's
    try:
        async with aiofiles.open(path, "rb", opener=_opener(inside, follow, outside)) as f:
            st = os.fstat(f.fileno())  # the opened file itself: no path lookup, nothing to wait for
            if not stat.S_ISREG(st.st_mode):
                return None, [Diagnostic(path, "", "not a regular file (FIFO, socket or device); refused")]
            if outside and st.st_uid != 0:
                owner = f"symlink target {outside[0]} is owned by uid {st.st_uid}, not root; refused"
                return None, [Diagnostic(path, "", owner)]
            if st.st_size > limit:
                return None, [Diagnostic(path, "", f"file too large: {st.st_size} bytes, limit {limit}")]
            # What the file holds, plus one byte to see it grew: a read of limit + 1 allocates that much.
            want = st.st_size + 1
            data = await f.read(want)
            if len(data) == want <= limit:  # it grew since the fstat: read on, up to the limit
                data += await f.read(limit + 1 - want)
    except Refused as exc:
        return None, [Diagnostic(path, "", str(exc))]
    except FileNotFoundError:
        return None, []
    except OSError as exc:
        return None, [Diagnostic(path, "", f"cannot read: {exc.strerror or exc}")]
    if len(data) > limit:
        return None, [Diagnostic(path, "", f"file too large: more than {limit} bytes")]
    return data, []


def _drop_in_names(conf_d: Path, errors: list[Diagnostic]) -> list[str]:
    try:
        # Directories are skipped, as containers/image's WalkDir does (a symlink to one is not).
        entries = os.scandir(conf_d)
        return sorted(e.name for e in entries if e.name.endswith(".conf") and not e.is_dir(follow_symlinks=False))
    except (FileNotFoundError, NotADirectoryError):
        return []
    except OSError as exc:
        errors.append(Diagnostic(conf_d, "", f"cannot list: {exc.strerror or exc}"))
        return []


async def read_snapshot(inputs: Inputs) -> Snapshot:
    """Read all inputs: files through aiofiles, all at once; directory listings in a thread.

    Each aiofiles call is a hop to the executor, so the files are read concurrently, not
    one after the other; errors keep the order of a sequential read.
    """
    snap = Snapshot()
    limit = inputs.max_file_size
    listing: list[Diagnostic] = []
    drop_ins = [inputs.conf_d / n for n in await asyncio.to_thread(_drop_in_names, inputs.conf_d, listing)]
    main, *read, yaml = await asyncio.gather(
        _read(inputs.main, limit),
        *(_read(p, limit, inside=inputs.conf_d, follow=inputs.follow_symlinks) for p in drop_ins),
        _read(inputs.yaml, limit) if inputs.yaml is not None else _nothing(),
    )
    snap.main = main[0]
    snap.errors += main[1] + listing
    for path, (data, errors) in zip(drop_ins, read, strict=True):
        snap.errors += errors
        if data is not None:
            snap.drop_ins.append((path, data))
    snap.yaml = yaml[0]
    snap.errors += yaml[1]
    for root in reversed(inputs.certs_dirs):  # earlier roots override later ones
        snap.certs.update(await asyncio.to_thread(_scan_certs, root, snap.warnings))
    return snap


async def _nothing() -> tuple[bytes | None, list[Diagnostic]]:
    return None, []


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
