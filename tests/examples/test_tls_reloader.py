"""examples/tls_reloader rotates its cert/key pair under a client that never stops connecting.

The example runs as users run it (``python -m examples.tls_reloader``); the pairs are real
self-signed certificates from the ``openssl`` CLI; every connection is a full handshake
that verifies the chain against the generated certificates only, so a server holding a
certificate with the wrong key could not complete one.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import random
import shutil
import signal
import ssl
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl CLI"),
]

REPO = Path(__file__).resolve().parents[2]
GREETING = b"hello over TLS\n"
REJECTED = "rejected until it changes"
SETTLE_BOUND = 10.0
"""Seconds the new certificate may take to show once both halves are on disk (quiet is 0.2 s)."""


@dataclass(frozen=True)
class Identity:
    """One self-signed certificate and its key, as bytes, and what a client sees of it."""

    cert: bytes
    key: bytes
    fingerprint: str


def make_identities(folder: Path, count: int) -> list[Identity]:
    out = []
    for i in range(count):
        cert, key = folder / f"gen{i}.crt", folder / f"gen{i}.key"
        subprocess.run(
            ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
             "-keyout", str(key), "-out", str(cert), "-days", "2", "-subj", f"/CN=tls-reloader-{i}",
             "-addext", "subjectAltName=DNS:localhost", "-set_serial", str(1000 + i)],
            check=True, capture_output=True,
        )
        der = ssl.PEM_cert_to_DER_cert(cert.read_text())
        out.append(Identity(cert.read_bytes(), key.read_bytes(), hashlib.sha256(der).hexdigest()))
    assert len({i.fingerprint for i in out}) == count
    return out


def write_renamed(path: Path, data: bytes) -> None:
    """The way cert-manager style tools write: a temp file beside it, renamed over it."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def write_in_place(path: Path, data: bytes) -> None:
    """Truncate and rewrite the same inode, in two writes."""
    with open(path, "wb") as f:
        f.write(data[: len(data) // 2])
        f.flush()
        f.write(data[len(data) // 2 :])


WRITERS: dict[str, Callable[[Path, bytes], None]] = {"rename": write_renamed, "in-place": write_in_place}


@dataclass
class Prober:
    """Connects in a loop; records which certificate each completed handshake saw, and failures."""

    port: int
    client: ssl.SSLContext
    seen: list[tuple[float, str]] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    cond: asyncio.Condition = field(default_factory=asyncio.Condition)

    async def connect_once(self) -> str:
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", self.port, ssl=self.client, server_hostname="localhost", ssl_handshake_timeout=10)
        try:
            der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
            writer.write(b"GET / HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
            answer = await asyncio.wait_for(reader.read(), 10)
            assert answer.startswith(b"HTTP/1.1 200 ") and answer.endswith(GREETING), answer
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError, ssl.SSLError):
                await writer.wait_closed()
        return hashlib.sha256(der).hexdigest()

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                fingerprint = await self.connect_once()
            except (OSError, ssl.SSLError, AssertionError, TimeoutError) as exc:
                self.failures.append(f"{loop.time():.3f}: {exc!r}")
            else:
                async with self.cond:
                    self.seen.append((loop.time(), fingerprint))
                    self.cond.notify_all()
            await asyncio.sleep(0.01)

    async def wait_for(self, fingerprint: str, timeout: float) -> None:
        def latest() -> bool:
            return bool(self.seen) and self.seen[-1][1] == fingerprint

        async with self.cond:
            await asyncio.wait_for(self.cond.wait_for(latest), timeout)


@contextlib.asynccontextmanager
async def example_server(cert: Path, key: Path, log: Path) -> AsyncIterator[int]:
    with log.open("wb") as err:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "examples.tls_reloader", "--cert", str(cert), "--key", str(key), "--port", "0",
            cwd=REPO, stdout=asyncio.subprocess.PIPE, stderr=err,
        )
    try:
        assert proc.stdout is not None
        line = (await asyncio.wait_for(proc.stdout.readline(), 30)).decode()
        assert line.startswith("listening on 127.0.0.1:"), (line, log.read_text())  # noqa: ASYNC240 - a failure message
        yield int(line.rsplit(":", 1)[1])
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
        code = await asyncio.wait_for(proc.wait(), 20)
    assert code == 0, log.read_text()  # noqa: ASYNC240 - a failure message, after the server exited


def rejections(log: Path) -> list[str]:
    return [line for line in log.read_text().splitlines() if REJECTED in line]


async def test_rotations_in_both_orders_never_break_a_handshake(tmp_path: Path) -> None:
    seed = int(os.environ.get("TLS_ROTATION_SEED", random.randrange(1 << 30)))
    rng = random.Random(seed)
    gaps = [0.02, 3.0, *(round(rng.uniform(0.02, 3.0), 3) for _ in range(3))]
    rng.shuffle(gaps)
    # (which half goes first, how the first half is written, how the second one is)
    shapes = [("cert", "rename", "in-place"), ("key", "in-place", "rename"), ("cert", "in-place", "in-place"),
              ("key", "rename", "rename"), ("cert", "rename", "in-place")]
    plan = [(*shape, gap) for shape, gap in zip(shapes, gaps, strict=True)]
    why = f"seed {seed} (TLS_ROTATION_SEED), plan {plan}"

    ids = make_identities(tmp_path, len(plan) + 1)
    folder = tmp_path / "tls"
    folder.mkdir()
    files = {"cert": folder / "tls.crt", "key": folder / "tls.key"}
    files["cert"].write_bytes(ids[0].cert)
    files["key"].write_bytes(ids[0].key)
    index = {ident.fingerprint: n for n, ident in enumerate(ids)}
    client = ssl.create_default_context(cadata="".join(i.cert.decode() for i in ids))
    log = tmp_path / "server.log"
    loop = asyncio.get_running_loop()

    async with example_server(files["cert"], files["key"], log) as port:
        prober = Prober(port, client)
        probing = asyncio.create_task(prober.run())
        try:
            await prober.wait_for(ids[0].fingerprint, SETTLE_BOUND)
            for n, (first, first_how, second_how, gap) in enumerate(plan, start=1):
                second = "key" if first == "cert" else "cert"
                before = len(rejections(log))
                WRITERS[first_how](files[first], getattr(ids[n], first))
                await asyncio.sleep(gap)
                second_at = loop.time()
                WRITERS[second_how](files[second], getattr(ids[n], second))
                await prober.wait_for(ids[n].fingerprint, SETTLE_BOUND)

                half = [fp for t, fp in prober.seen if t < second_at and index.get(fp, n) >= n]
                assert not half, f"rotation {n}: new certificate served before its key was written; {why}"
                lines = rejections(log)[before:]
                if gap >= 1.0:  # the first half settled alone: one line, not one per retry
                    assert len(lines) == 1, (n, lines, why)
                    assert f"tls.{'crt' if first == 'cert' else 'key'} in consumer tls" in lines[0], lines
                elif gap <= 0.05:  # both halves on disk before either settled: nothing to say
                    assert lines == [], (n, lines, why)
                else:
                    assert len(lines) <= 1, (n, lines, why)
        finally:
            probing.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await probing

    assert prober.failures == [], (prober.failures, why)
    order = [index.get(fp, -1) for _, fp in prober.seen]
    assert -1 not in order, "a certificate that was never written was served"
    assert order == sorted(order), f"an older pair came back: {order}; {why}"
    assert set(order) == set(range(len(ids))), (order, why)
    assert len(order) > 4 * len(plan), f"the prober barely ran ({len(order)} handshakes); {why}"
    swaps = [line for line in log.read_text().splitlines() if "tls_reloader: Serving " in line]
    assert len(swaps) == 1 + len(plan), (swaps, why)  # the first pair, then one reload per rotation


async def test_a_mismatched_pair_at_start_is_refused(tmp_path: Path) -> None:
    a, b = make_identities(tmp_path, 2)
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    cert.write_bytes(a.cert)
    key.write_bytes(b.key)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "examples.tls_reloader", "--cert", str(cert), "--key", str(key), "--port", "0",
        cwd=REPO, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 1
    assert out == b""
    assert f"{key} does not belong to the certificate in {cert}" in err.decode()


async def test_a_kubelet_secret_volume_swap_is_one_rotation(tmp_path: Path) -> None:
    """A Secret mounted by the kubelet: tls.crt -> ..data/tls.crt, and ``..data`` is re-pointed atomically."""
    ids = make_identities(tmp_path, 3)
    volume = tmp_path / "secret"
    volume.mkdir()

    def publish(n: int) -> None:
        version = volume / f"..v{n}"
        version.mkdir()
        (version / "tls.crt").write_bytes(ids[n].cert)
        (version / "tls.key").write_bytes(ids[n].key)
        (volume / "..data_tmp").symlink_to(version.name)
        os.replace(volume / "..data_tmp", volume / "..data")
        if n:
            shutil.rmtree(volume / f"..v{n - 1}")

    publish(0)
    for name in ("tls.crt", "tls.key"):
        (volume / name).symlink_to(f"..data/{name}")
    client = ssl.create_default_context(cadata="".join(i.cert.decode() for i in ids))
    log = tmp_path / "server.log"
    async with example_server(volume / "tls.crt", volume / "tls.key", log) as port:
        prober = Prober(port, client)
        probing = asyncio.create_task(prober.run())
        try:
            await prober.wait_for(ids[0].fingerprint, SETTLE_BOUND)
            for n in (1, 2):
                publish(n)
                await prober.wait_for(ids[n].fingerprint, SETTLE_BOUND)
        finally:
            probing.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await probing
    assert prober.failures == []
    assert rejections(log) == [], "both halves change in one swap: never half-rotated"
    order = [[i.fingerprint for i in ids].index(fp) for _, fp in prober.seen]
    assert order == sorted(order)
