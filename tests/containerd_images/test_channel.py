"""Blob streaming reaches containerd's socket in few large writes, not one per 16 KiB frame."""

from __future__ import annotations

import hashlib
import os
from datetime import timedelta
from typing import Any

from reloadd_containerd_images._channel import CoalescingTransport
from reloadd_containerd_images._client import ContainerdClient
from reloadd_containerd_images._content import BytesSource, write_blob

from tests.infra import Containerd

BLOB = 8 << 20
FRAME = 16 << 10


async def test_blob_stream_is_joined_into_few_socket_writes(ctd: Containerd) -> None:
    client = ContainerdClient(ctd.address, "k8s.io")
    writes: list[int] = []
    try:
        await client.version()  # connects
        proto: Any = client.channel._protocol
        transport = proto.connection._transport
        real = transport._transport if isinstance(transport, CoalescingTransport) else transport
        real_write = real.write

        def counting(data: bytes) -> None:
            writes.append(len(data))
            real_write(data)

        real.write = counting  # type: ignore[method-assign]
        data = os.urandom(BLOB)
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        lease = await client.create_lease(timedelta(minutes=5), {})
        res = await write_blob(client, "test-channel", BLOB, digest, BytesSource(data), lease)
        assert res.digest == digest and res.bytes_sent == BLOB
        back = await client.read_blob(digest, BLOB, lease)
        assert back == data
    finally:
        client.close()
    frames = BLOB // FRAME
    # 512 DATA frames; a few socket writes per 1 MiB message (HTTP/2 window updates and
    # pings answered meanwhile) — before, every frame was a write of its own.
    assert sum(writes) > BLOB
    assert len(writes) < frames // 4, f"{len(writes)} writes for {frames} frames"
