"""reloadd consumer importing image tarballs and pre-pulling ``.txt`` lists into containerd.

Entry point ``containerd-images`` in the ``reloadd.consumers`` group.
"""

from __future__ import annotations

from reloadd import Consumer, ConsumerContext

from ._consumer import ContainerdImagesConsumer
from ._settings import Settings

__all__ = ["ContainerdImagesConsumer", "Settings", "create"]


def create(ctx: ConsumerContext) -> Consumer:
    """Build the consumer from its context (options validated here)."""
    return ContainerdImagesConsumer(ctx, Settings.from_context(ctx))
