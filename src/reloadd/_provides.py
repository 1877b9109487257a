"""What one consumer provides that another may need: the question no single consumer can answer alone.

A ``containerd-images`` consumer knows which file of its folder provides an image name and how its import
went; a ``kube-manifests`` consumer whose Deployment waits for that image (``ErrImageNeverPull``) knows only
the name. A consumer implementing :class:`Providing` publishes :class:`Provision` entries; every consumer
of the same :class:`~reloadd.Reloader` reads them through :attr:`ConsumerContext.provided
<reloadd.ConsumerContext.provided>`, so the failure can name the file (``image registry.local/web:1.4 is
in images/web.tar, import failed: ...``). Optional on both sides: a consumer that does neither sees no change.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Protocol, runtime_checkable

__all__ = ["Providing", "Provision", "ProvisionState", "provisions_for"]

log = logging.getLogger(__name__)


class ProvisionState(StrEnum):
    """How the delivery of a provided thing went."""

    DELIVERED = "delivered"
    """It is there (an image imported or pulled)."""
    PENDING = "pending"
    """Its file is being handled, or waits (for its signature, a retry)."""
    FAILED = "failed"
    """Its file's handling failed; :attr:`Provision.detail` says why."""
    REFUSED = "refused"
    """Its file was refused (verification); :attr:`Provision.detail` says why."""


@dataclass(frozen=True, slots=True)
class Provision:
    """One thing a consumer's file provides, and how its delivery went.

    Attributes:
        kind: What it is, a word both sides agree on (``image``).
        name: Its name as the provider knows it (``registry.local/web:1.4``); readers normalise as they need.
        path: The file that provides it.
        state: How its delivery went.
        detail: The provider's own phrase for it (``import failed: ...``), or ``""``.
        shown: The path as the provider's messages show it (``images/web.tar``), or ``""`` for :attr:`path`.
        consumer: The providing consumer's name (filled in by the core).
    """

    kind: str
    name: str
    path: Path
    state: ProvisionState
    detail: str = ""
    shown: str = ""
    consumer: str = ""

    def line(self) -> str:
        """``image registry.local/web:1.4 is in images/web.tar, import failed: ...``."""
        return f"{self.kind} {self.name} is in {self.shown or self.path}, {self.detail or self.state.value}"


@runtime_checkable
class Providing(Protocol):
    """The optional half of the contract for consumers whose files provide things other consumers use."""

    def provisions(self, kind: str) -> Iterable[Provision]:
        """What its files provide of ``kind`` now (``()`` for kinds it does not know). Called on the event
        loop, when another consumer asks (a failure being explained): keep it cheap, never block."""
        ...


class _Named(Protocol):
    """A :class:`~reloadd.Consumer` as seen here (``_consumer`` imports this module, not the reverse)."""

    @property
    def name(self) -> str: ...


def provisions_for(me: _Named, every: Sequence[_Named]) -> Callable[[str], tuple[Provision, ...]]:
    """``me``'s :attr:`ConsumerContext.provided <reloadd.ConsumerContext.provided>`: the :class:`Provision`
    entries of every other :class:`Providing` consumer of ``every``, each with its :attr:`~Provision.consumer`
    set. A provider that raises is a plugin bug: logged, and its entries left out (an explanation must
    never fail the caller)."""

    def provided(kind: str) -> tuple[Provision, ...]:
        out: list[Provision] = []
        for other in every:
            if other is me or not isinstance(other, Providing):
                continue
            try:
                out.extend(p if p.consumer else _named(p, other.name) for p in other.provisions(kind))
            except Exception as exc:  # a plugin bug must not fail the asker
                log.warning("Failed to read what %s provides: %s", other.name, exc)
        return tuple(out)

    return provided


def _named(p: Provision, consumer: str) -> Provision:
    return Provision(p.kind, p.name, p.path, p.state, p.detail, p.shown, consumer)
