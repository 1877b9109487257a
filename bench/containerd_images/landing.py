"""Benchmark: a tarball landing in the watched folder of a running daemon, against ``ctr images import``.

    python -m bench.containerd_images.landing [--sizes 50,150,550] [--pairs 3] [--releases 1.6,1.7,2.x]
                                              [--workdir DIR] [--md FILE]

Issue #26's figure, timed as an operator meets it. For each containerd release and each archive size
(gzip layers, 7/8 random data), interleaved pairs on a fresh private containerd each (alternating who
goes first):

- **reloadd**: ``reloadd run`` with one containerd-images consumer at its defaults is started and ready
  (not timed); the archive, staged on the same file system, is renamed into the watched folder, and the
  clock stops when the daemon logs the file imported (after content, unpack and image records: what
  ``ctr`` does too). Settling, digesting, the import and the unpack all count.
- **ctr**: that release's ``ctr -n k8s.io images import --all-platforms FILE``, as a whole process.

The figure is the median of the per-pair ratios reloadd/ctr (target ≤ 0.9).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.daemon.__main__ import _ready
from examples.demo.run_demo import _free_port
from tests.infra import RELEASES, private_containerd

from .gen import big_oci_tarball

_LAYERS = {50: 2, 150: 4, 550: 6}


def _layers(mb: int) -> int:
    return _LAYERS.get(mb, max(1, round(mb / 90)))


async def _ctr(release: str, address: str, archive: Path) -> float:
    ctr = RELEASES[release].binary("ctr")
    t0 = time.monotonic()
    proc = await asyncio.create_subprocess_exec(
        ctr, "-a", address, "-n", "k8s.io", "images", "import", "--all-platforms", str(archive),
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
    _, err = await proc.communicate()
    dt = time.monotonic() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"ctr import failed: {err.decode()[-2000:]}")
    return dt


async def _reloadd(root: Path, address: str, archive: Path) -> float:
    folder = root / "images"
    folder.mkdir()
    staged = root / "staging" / archive.name
    staged.parent.mkdir()
    shutil.copyfile(archive, staged)  # same file system as the folder: the landing is one rename
    port = _free_port()
    cfg = root / "reloadd.toml"
    cfg.write_text(
        f'[reloadd]\nstate_dir = "{root / "state"}"\nmetrics_listen = "127.0.0.1:{port}"\n\n'
        f'[[consumer]]\nname = "images"\nplugin = "containerd-images"\npaths = ["{folder}"]\n'
        f'[consumer.options]\naddress = "{address}"\nnamespace = "k8s.io"\n')
    log = root / "reloadd.log"
    with open(log, "ab") as out:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "reloadd", "run", "--config", str(cfg),
            stdin=asyncio.subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not await asyncio.to_thread(_ready, port):
            if proc.returncode is not None or time.monotonic() > deadline:
                raise RuntimeError(f"reloadd did not get ready: {log.read_text()[-2000:]}")
            await asyncio.sleep(0.2)
        await asyncio.sleep(1.0)  # past the start-up pass
        mark = f"Imported {folder / archive.name}:".encode()
        seen = log.stat().st_size
        t0 = time.monotonic()
        os.rename(staged, folder / archive.name)
        while True:
            with open(log, "rb") as f:
                f.seek(seen)
                if mark in f.read():
                    return time.monotonic() - t0
            if proc.returncode is not None or time.monotonic() - t0 > 600:
                raise RuntimeError(f"no import logged: {log.read_text()[-2000:]}")
            await asyncio.sleep(0.01)
    finally:
        if proc.returncode is None:
            proc.terminate()
            await proc.wait()


async def _fresh(work: Path, release: str, who: str, archive: Path) -> float:
    d = Path(tempfile.mkdtemp(prefix=f"landing-{who}-", dir=work))
    async with private_containerd(d, release=release) as ctd:
        if who == "ctr":
            dt = await _ctr(release, ctd.address, archive)
        else:
            dt = await _reloadd(d, ctd.address, archive)
    shutil.rmtree(d, ignore_errors=True)  # kept (with the logs) when something failed
    return dt


async def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    args.workdir.mkdir(parents=True, exist_ok=True)
    rows = []
    for size in args.sizes:
        layers = _layers(size)
        archive = args.workdir / f"landing-{layers}x{size // layers}.tar"
        if not archive.exists():
            print(f"generating {archive} ...", flush=True)
            big_oci_tarball(archive, f"example.com/bench/landing{size}:v1", layers, size // layers)
        for release in args.releases:
            ctr_t, ours_t, ratios = [], [], []
            for i in range(args.pairs):
                pair = {}
                for who in ("ctr", "ours") if i % 2 == 0 else ("ours", "ctr"):
                    pair[who] = await _fresh(args.workdir, release, who, archive)
                ctr_t.append(pair["ctr"])
                ours_t.append(pair["ours"])
                ratios.append(pair["ours"] / pair["ctr"])
                print(f"  [{release}] {archive.stat().st_size / 1e6:.0f} MB pair {i + 1}: ctr {pair['ctr']:.2f} s, "
                      f"reloadd {pair['ours']:.2f} s, ratio {ratios[-1]:.2f}", flush=True)
            rows.append({"release": release, "mb": archive.stat().st_size / 1e6, "layers": layers, "ctr": ctr_t,
                         "ours": ours_t, "ratios": ratios})
    return rows


def report(rows: list[dict[str, Any]], args: argparse.Namespace) -> str:
    med = statistics.median
    lines = [
        f"## Tarball landing vs ctr ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, issue #26)",
        "",
        "`python -m bench.containerd_images.landing`: an archive (gzip layers) renamed into the folder of a "
        "running `reloadd run` (containerd-images at its defaults), timed until the daemon logs the file imported "
        "(content, unpack, image records), against that release's `ctr images import --all-platforms` of the "
        f"same file; a fresh private containerd for each, {args.pairs} interleaved pairs. Target: median of the "
        "per-pair ratios ≤ 0.9.",
        "",
        "| containerd | archive | ctr, median | reloadd, median | ratios | median ratio | |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        ratio = med(r["ratios"])
        lines.append(
            f"| {r['release']} | {r['mb']:.0f} MB, {r['layers']} layers | {med(r['ctr']):.2f} s | "
            f"{med(r['ours']):.2f} s | {', '.join(f'{x:.2f}' for x in r['ratios'])} | **{ratio:.2f}** | "
            f"{'met' if ratio <= 0.9 else 'not met'} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="50,150,550", help="archive sizes in MB, comma-separated")
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--releases", default=",".join(RELEASES), help="containerd releases, comma-separated")
    ap.add_argument("--workdir", type=Path, default=Path("/var/tmp/reloadd-bench-containerd"))
    ap.add_argument("--md", type=Path)
    args = ap.parse_args()
    args.sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    args.releases = [r.strip() for r in args.releases.split(",") if r.strip()]
    rows = asyncio.run(run(args))
    text = report(rows, args)
    print(text)
    if args.md is not None:
        args.md.parent.mkdir(parents=True, exist_ok=True)
        args.md.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
