"""Reading a manifest file into objects, safely.

YAML streams are split on ``---`` separator lines first (as kubectl's reader does), so a syntax error in
one document is reported with its line and does not hide the documents around it. Every document is
*composed* (node graph) before it is *constructed*, and rejected when:

* expanding its aliases would visit more than ``max_nodes`` nodes (billion-laughs bombs), or an alias is
  recursive;
* it nests deeper than ``max_depth`` (stack exhaustion in the constructor or in JSON encoding).

The file itself is rejected, unread beyond the limit, when larger than ``max_bytes``. Only safe tags are
constructed; timestamps stay strings, as the API server would read them.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from reloadd import PermanentError, TransientError

__all__ = ["DocError", "Manifest", "ManifestError", "ManifestObject", "load_manifest", "parse_manifest"]

_Loader: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _ManifestLoader(_Loader):  # type: ignore[misc]
    """Safe loader that keeps timestamps and binaries as the strings they are on the wire."""


def _as_string(loader: Any, node: Any) -> Any:
    return loader.construct_scalar(node)


_ManifestLoader.add_constructor("tag:yaml.org,2002:timestamp", _as_string)
_ManifestLoader.add_constructor("tag:yaml.org,2002:binary", _as_string)

_STRIP_METADATA = ("managedFields", "resourceVersion", "uid", "selfLink", "creationTimestamp", "generation")


class ManifestError(PermanentError):
    """The whole file was rejected (unreadable, too large)."""


@dataclass(frozen=True, slots=True)
class DocError:
    """A document that could not be used.

    Attributes:
        doc: 1-based number of the document in the file (counting non-empty documents).
        line: 1-based line where the document starts.
        message: What is wrong.
    """

    doc: int
    line: int
    message: str

    def __str__(self) -> str:
        return f"doc {self.doc} (line {self.line}): {self.message}"


@dataclass(frozen=True, slots=True)
class ManifestObject:
    """One object to apply.

    Attributes:
        doc: 1-based document number.
        line: Line where its document starts.
        item: Index inside a ``List`` document, else ``None``.
        body: The object (``apiVersion``, ``kind``, ``metadata.name`` guaranteed present).
    """

    doc: int
    line: int
    item: int | None
    body: dict[str, Any]

    @property
    def where(self) -> str:
        """``doc 2 (line 14)`` or ``doc 2 item 3 (line 14)`` for messages."""
        item = f" item {self.item}" if self.item is not None else ""
        return f"doc {self.doc}{item} (line {self.line})"

    @property
    def api_version(self) -> str:
        """``apiVersion``."""
        return str(self.body["apiVersion"])

    @property
    def kind(self) -> str:
        """``kind``."""
        return str(self.body["kind"])

    @property
    def name(self) -> str:
        """``metadata.name``."""
        return str(self.body["metadata"]["name"])

    @property
    def namespace(self) -> str | None:
        """``metadata.namespace`` if set."""
        ns = self.body["metadata"].get("namespace")
        return str(ns) if ns else None


@dataclass
class Manifest:
    """The outcome of reading one file.

    Attributes:
        sha256: Hex digest of the content.
        objects: Usable objects in file order.
        errors: Documents that could not be used.
    """

    sha256: str
    objects: list[ManifestObject] = field(default_factory=list)
    errors: list[DocError] = field(default_factory=list)


def _split(text: str) -> Iterator[tuple[int, str]]:
    """Yield ``(first_line, chunk)`` for each ``---``-separated chunk."""
    start, lines = 1, list[str]()
    for no, line in enumerate(text.splitlines(keepends=True), 1):
        if line.rstrip() == "---":
            yield start, "".join(lines)
            start, lines = no + 1, []
        else:
            lines.append(line)
    yield start, "".join(lines)


def _check_graph(node: Any, budget: list[int], max_depth: int) -> None:
    """Count ``node``'s expanded size against ``budget[0]``; reject cycles and deep nesting."""
    sizes: dict[int, int] = {}
    visiting: set[int] = set()
    # Iterative post-order walk: (node, depth, children_done)
    stack: list[tuple[Any, int, bool]] = [(node, 1, False)]
    while stack:
        cur, depth, done = stack.pop()
        key = id(cur)
        if done:
            visiting.discard(key)
            total = 1
            for child in _children(cur):
                total += sizes[id(child)]
            sizes[key] = total
            if total > budget[0]:
                raise ValueError(f"expands to more than {budget[0]} nodes (alias bomb?)")
            continue
        if key in sizes:
            continue
        if key in visiting:
            raise ValueError("recursive alias")
        if depth > max_depth:
            raise ValueError(f"nested deeper than {max_depth} levels")
        visiting.add(key)
        stack.append((cur, depth, True))
        for child in _children(cur):
            if id(child) in visiting:
                raise ValueError("recursive alias")
            if id(child) not in sizes:
                stack.append((child, depth + 1, False))
    budget[0] -= sizes[id(node)]


def _children(node: Any) -> list[Any]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    return []


def _yaml_docs(text: str, max_nodes: int, max_depth: int) -> Iterator[tuple[int, Any, str | None]]:
    """Yield ``(line, value, error)`` per YAML document; ``value`` is None for errors and empty docs."""
    budget = [max_nodes]
    for start, chunk in _split(text):
        loader = _ManifestLoader(chunk)
        try:
            while loader.check_node():
                node = loader.get_node()
                line = start + (node.start_mark.line if node.start_mark else 0)
                try:
                    _check_graph(node, budget, max_depth)
                    yield line, loader.construct_document(node), None
                except (ValueError, RecursionError, yaml.YAMLError) as exc:
                    yield line, None, f"rejected: {exc}"
        except (yaml.YAMLError, RecursionError) as exc:
            mark = getattr(exc, "problem_mark", None)
            line = start + (mark.line if mark is not None else 0)
            yield start, None, f"YAML error at line {line}: {getattr(exc, 'problem', None) or exc}"
        finally:
            loader.dispose()


def _expand(doc: int, line: int, value: Any, out: Manifest) -> None:
    if not isinstance(value, dict):
        out.errors.append(DocError(doc, line, f"expected an object, got {type(value).__name__}"))
        return
    kind = value.get("kind")
    if isinstance(kind, str) and kind.endswith("List") and isinstance(value.get("items"), list):
        for i, item in enumerate(value["items"]):
            _add(doc, line, i, item, out)
        return
    _add(doc, line, None, value, out)


def _add(doc: int, line: int, item: int | None, value: Any, out: Manifest) -> None:
    where = f"item {item}: " if item is not None else ""
    if not isinstance(value, dict):
        out.errors.append(DocError(doc, line, f"{where}expected an object, got {type(value).__name__}"))
        return
    meta: Any = value.get("metadata")
    missing = [k for k in ("apiVersion", "kind") if not isinstance(value.get(k), str) or not value.get(k)]
    if not isinstance(meta, dict) or not isinstance(meta.get("name"), str) or not meta.get("name"):
        missing.append("metadata.name")
    if missing:
        out.errors.append(DocError(doc, line, f"{where}missing {', '.join(missing)}"))
        return
    for key in _STRIP_METADATA:
        meta.pop(key, None)
    try:
        json.dumps(value)
    except (TypeError, ValueError, RecursionError) as exc:
        out.errors.append(DocError(doc, line, f"{where}not representable as JSON: {exc}"))
        return
    out.objects.append(ManifestObject(doc, line, item, value))


def parse_manifest(
    data: bytes, *, json_file: bool = False, max_nodes: int = 1_000_000, max_depth: int = 200
) -> Manifest:
    """Parse ``data`` (a YAML stream, or one JSON value when ``json_file``) into a :class:`Manifest`."""
    out = Manifest(hashlib.sha256(data).hexdigest())
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        out.errors.append(DocError(1, 1, f"not UTF-8: {exc}"))
        return out
    if json_file:
        try:
            value = json.loads(text)
        except (ValueError, RecursionError) as exc:
            out.errors.append(DocError(1, getattr(exc, "lineno", 1), f"JSON error: {exc}"))
            return out
        _expand(1, 1, value, out)
        return out
    doc = 0
    for line, value, error in _yaml_docs(text, max_nodes, max_depth):
        if error is None and value is None:
            continue  # empty document
        doc += 1
        if error is not None:
            out.errors.append(DocError(doc, line, error))
        else:
            _expand(doc, line, value, out)
    return out


def _read(path: Path, max_bytes: int) -> bytes:
    """The bytes of ``path``, up to ``max_bytes`` + 1 (one more says it is too large)."""
    with open(path, "rb") as f:
        # As many bytes as the file holds, plus one to see it grew: a read of max_bytes + 1 allocates
        # that much (5 MiB) up front, whatever the file holds, for every file a worker reads.
        want = min(os.fstat(f.fileno()).st_size, max_bytes) + 1  # the opened file: nothing to wait for
        data = f.read(want)
        if len(data) == want <= max_bytes:  # it grew since: read on, up to the limit
            data += f.read(max_bytes + 1 - want)
    return data


def _load(path: Path, max_bytes: int, max_nodes: int) -> Manifest:
    """Read and parse ``path`` (see :func:`load_manifest`); runs in a worker thread."""
    try:
        data = _read(path, max_bytes)
    except FileNotFoundError as exc:
        raise TransientError(f"{path} vanished before it could be read; its delete follows") from exc
    except OSError as exc:
        raise ManifestError(f"cannot read {path}: {exc}") from exc
    if len(data) > max_bytes:
        raise ManifestError(f"{path} is larger than the {max_bytes} byte limit; not applied")
    return parse_manifest(data, json_file=path.suffix.lower() == ".json", max_nodes=max_nodes)


async def load_manifest(path: Path, *, max_bytes: int, max_nodes: int = 1_000_000) -> Manifest:
    """Read ``path`` and parse it in a worker thread (``.json`` files as JSON), off the event loop.

    One thread hop for the open, the reads and the parse: through aiofiles, each of the open, the read
    and the close was a hop of its own (four per file, ~400 in a 100-file start-up pass, each a wake-up of a
    thread and of the loop on a CPU-bound pass).

    Raises:
        ManifestError: when the file cannot be read or exceeds ``max_bytes``.
        TransientError: the file vanished since it was handed over (its delete follows).
    """
    return await asyncio.to_thread(_load, path, max_bytes, max_nodes)
