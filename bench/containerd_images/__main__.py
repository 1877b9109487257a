"""Benchmark: the containerd-images consumer vs ``ctr images import`` on the same containerd.

    python -m bench.containerd_images [--runs 5] [--layers 6] [--mb 100] [--releases 1.6,1.7,2.x]
                                      [--workdir DIR] [--out FILE] [--verify-only]

1. Import of a >= 500 MB multi-layer OCI tarball (gzip layers, with unpack), fresh containerd root per
   run, ctr and reloadd interleaved (alternating who goes first); median of the per-pair ratios. Done
   on each containerd release (1.6, 1.7, 2.x), against that release's own ``ctr``.
2. Re-import of the same, unchanged file into the same containerd (ctr re-sends everything; the
   consumer sends expected digests, so present blobs cost nothing).
3. 20 small tarballs in one batch at concurrency 1, 2 and 4.

Both sides are timed as whole processes (``ctr`` vs ``python -m bench.containerd_images.import_once``),
so the consumer pays its interpreter start-up too.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tests.infra import RELEASES, ImageSpec, private_containerd, write_oci_archive

from .gen import big_oci_tarball


async def _run(*cmd: str) -> tuple[float, str]:
    t0 = time.monotonic()
    proc = await asyncio.create_subprocess_exec(*cmd, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await proc.communicate()
    dt = time.monotonic() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"{cmd[0]} failed: {err.decode()[-2000:]}")
    return dt, out.decode()


async def ctr_import(ctr: str, address: str, *files: Path) -> float:
    total = 0.0
    for f in files:
        dt, _ = await _run(ctr, "-a", address, "-n", "k8s.io", "images", "import", "--all-platforms", str(f))
        total += dt
    return total


async def ours_import(address: str, concurrency: int, *files: Path, options: dict[str, Any] | None = None
                      ) -> tuple[float, dict[str, Any]]:
    extra = ["--options", json.dumps(options)] if options else []
    dt, out = await _run(
        sys.executable, "-m", "bench.containerd_images.import_once", *extra, address, str(concurrency),
        *map(str, files),
    )
    return dt, json.loads(out.strip().splitlines()[-1])


async def fresh(work: Path, tag: str, fn: Any, release: str = "1.6") -> Any:
    d = Path(tempfile.mkdtemp(prefix=f"{tag}-", dir=work))
    async with private_containerd(d, release=release) as ctd:
        result = await fn(ctd)
    shutil.rmtree(d, ignore_errors=True)  # kept (with containerd's log) when something failed
    return result


async def bench_big(work: Path, big: Path, runs: int, release: str) -> dict[str, Any]:
    ctr = RELEASES[release].binary("ctr")
    ctr_t, ours_t, ratios, rss, re_ctr, re_ours = [], [], [], [], [], []
    for i in range(runs):
        pair: dict[str, float] = {}
        order = ("ctr", "ours") if i % 2 == 0 else ("ours", "ctr")
        for who in order:

            async def one(ctd: Any, who: str = who, pair: dict[str, float] = pair, i: int = i) -> None:
                if who == "ctr":
                    pair["ctr"] = await ctr_import(ctr, ctd.address, big)
                    if i == 0:
                        re_ctr.append(await ctr_import(ctr, ctd.address, big))
                else:
                    pair["ours"], stats = await ours_import(ctd.address, 2, big)
                    rss.append(stats["max_rss_mb"])
                    if i == 0:
                        re_ours.append((await ours_import(ctd.address, 2, big))[0])

            await fresh(work, who, one, release)
        ctr_t.append(pair["ctr"])
        ours_t.append(pair["ours"])
        ratios.append(pair["ours"] / pair["ctr"])
        print(
            f"  [{release}] run {i + 1}: ctr {pair['ctr']:.2f}s  reloadd {pair['ours']:.2f}s  ratio {ratios[-1]:.2f}",
            flush=True,
        )
    return {
        "ctr": ctr_t,
        "ours": ours_t,
        "ratios": ratios,
        "median_ratio": statistics.median(ratios),
        "ours_max_rss_mb": max(rss),
        "reimport_ctr": re_ctr,
        "reimport_ours": re_ours,
    }


def signed(work: Path, big: Path) -> dict[str, Any]:
    """Sign ``big`` as a release engineer would (``openssl dgst -sha256 -sign``, an ECDSA P-256 key: cosign's
    blob signature bytes) and return the options of ``verify = "require"`` with that key."""
    keys = work / "bench-keys"
    keys.mkdir(exist_ok=True)
    priv, pub, sig = keys / "release.key", keys / "release.pub", big.with_name(big.name + ".sig")
    if not pub.exists():
        subprocess.run(["openssl", "genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                        "-out", str(priv)], check=True)
        subprocess.run(["openssl", "pkey", "-in", str(priv), "-pubout", "-out", str(pub)], check=True)
    if not sig.exists() or sig.stat().st_mtime < big.stat().st_mtime:
        der = subprocess.run(["openssl", "dgst", "-sha256", "-sign", str(priv), str(big)], check=True,
                             capture_output=True).stdout
        sig.write_bytes(base64.b64encode(der))
    return {"verify": "require", "trusted_keys": [str(pub)]}


async def bench_verify(work: Path, big: Path, runs: int, release: str) -> dict[str, Any]:
    """The big import with ``verify = "require"`` (a detached signature beside it) against ``off``, fresh
    containerd each, interleaved (alternating who goes first); median of the per-pair ratios (issue #60: ≤ 1.1)."""
    options = signed(work, big)
    off, req, ratios, cpu_off, cpu_req = [], [], [], [], []
    for i in range(runs):
        pair: dict[str, float] = {}
        for who in ("off", "require") if i % 2 == 0 else ("require", "off"):

            async def one(ctd: Any, who: str = who, pair: dict[str, float] = pair) -> None:
                dt, stats = await ours_import(ctd.address, 2, big, options=options if who == "require" else None)
                pair[who] = dt
                (cpu_req if who == "require" else cpu_off).append(stats["cpu_seconds"])

            await fresh(work, f"verify-{who}", one, release)
        off.append(pair["off"])
        req.append(pair["require"])
        ratios.append(pair["require"] / pair["off"])
        print(f"  [{release}] run {i + 1}: off {pair['off']:.2f}s  require {pair['require']:.2f}s  "
              f"ratio {ratios[-1]:.3f}", flush=True)
    return {"off": off, "require": req, "ratios": ratios, "median_ratio": statistics.median(ratios),
            "cpu_off": cpu_off, "cpu_require": cpu_req}


def verify_rows(size: int, runs: int, by_release: dict[str, dict[str, Any]]) -> list[str]:
    """The "verify = require vs off" table (issue #60)."""
    med = statistics.median
    lines = [
        f"## containerd-images: verify = \"require\" vs \"off\" "
        f"({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, issue #60)",
        "",
        f"The same {size / 1e6:.0f} MB archive imported by the consumer (whole process, fresh containerd each), "
        f"with its detached `.sig` checked against a P-256 key (hashed while it is imported, as archives from "
        f"64 MiB are), and without any check; {runs} interleaved pairs. Target: median ratio ≤ 1.1.",
        "",
        "| containerd | off, median (range) | require, median (range) | ratios | median ratio "
        "| reloadd CPU off / require, median |",
        "|---|---|---|---|---|---|",
    ]
    for r, res in by_release.items():
        lines.append(
            f"| {r} | {med(res['off']):.2f} s ({min(res['off']):.2f}–{max(res['off']):.2f}) "
            f"| {med(res['require']):.2f} s ({min(res['require']):.2f}–{max(res['require']):.2f}) "
            f"| {', '.join(f'{x:.3f}' for x in res['ratios'])} | **{res['median_ratio']:.3f}** "
            f"| {med(res['cpu_off']):.2f} s / {med(res['cpu_require']):.2f} s |"
        )
    return lines


async def bench_many(work: Path, rounds: int) -> dict[int, list[float]]:
    files = []
    src = work / "many"
    src.mkdir(exist_ok=True)
    for n in range(20):
        f = src / f"img{n:02}.tar"
        if not f.exists():
            write_oci_archive(f, [ImageSpec(f"example.com/many{n}:v1", seed=f"many{n}", layers=3, layer_size=4 << 20)])
        files.append(f)
    out: dict[int, list[float]] = {1: [], 2: [], 4: []}
    for r in range(rounds):
        for c in (1, 2, 4) if r % 2 == 0 else (4, 2, 1):

            async def one(ctd: Any, c: int = c) -> None:
                dt, _ = await ours_import(ctd.address, c, *files)
                out[c].append(dt)

            await fresh(work, f"many{c}", one)
        print(f"  round {r + 1}: " + "  ".join(f"c={c} {v[-1]:.2f}s" for c, v in out.items()), flush=True)
    return out


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--mb", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--releases", default=",".join(RELEASES), help="containerd releases, comma-separated")
    ap.add_argument("--workdir", type=Path, default=Path("/var/tmp/reloadd-bench-containerd"))
    ap.add_argument("--out", type=Path)
    ap.add_argument("--verify-only", action="store_true",
                    help='only the big import with verify = "require" against "off" (issue #60)')
    a = ap.parse_args()
    a.workdir.mkdir(parents=True, exist_ok=True)
    big = a.workdir / f"big-{a.layers}x{a.mb}.tar"
    if not big.exists():
        print(f"generating {big} ...", flush=True)
        big_oci_tarball(big, "example.com/bench/big:v1", a.layers, a.mb)
    size = big.stat().st_size
    print(f"big tarball: {size / 1e6:.0f} MB, {a.layers} gzip layers", flush=True)
    releases = [r.strip() for r in a.releases.split(",") if r.strip()]
    if a.verify_only:
        text = "\n".join(verify_rows(size, a.runs, {r: await bench_verify(a.workdir, big, a.runs, r)
                                                    for r in releases})) + "\n"
        print(text)
        if a.out:
            a.out.write_text(text)
        return
    by_release = {r: await bench_big(a.workdir, big, a.runs, r) for r in releases}
    res_many = await bench_many(a.workdir, a.rounds)
    med = statistics.median
    lines = [
        f"## containerd-images benchmark ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})",
        "",
        f"Big tarball: {size / 1e6:.0f} MB OCI archive, {a.layers} gzip layers, import + unpack, fresh root "
        f"per run, {a.runs} interleaved pairs per containerd release, each against its own `ctr`.",
        "",
        "| containerd | ctr images import, median (range) | reloadd, median (range) | peak RSS | "
        "median ratio reloadd/ctr | re-import ctr / reloadd |",
        "|---|---|---|---|---|---|",
    ]
    for r, res in by_release.items():
        lines.append(
            f"| {r} | {med(res['ctr']):.2f} s ({min(res['ctr']):.2f}–{max(res['ctr']):.2f}) "
            f"| {med(res['ours']):.2f} s ({min(res['ours']):.2f}–{max(res['ours']):.2f}) "
            f"| {res['ours_max_rss_mb']:.0f} MB | **{res['median_ratio']:.2f}** "
            f"({', '.join(f'{x:.2f}' for x in res['ratios'])}) "
            f"| {res['reimport_ctr'][0]:.2f} s / {res['reimport_ours'][0]:.2f} s |"
        )
    lines += [
        "",
        "- 20 tarballs (3 layers x 4 MB each) in one batch (1.6): "
        + ", ".join(f"concurrency {c}: median {med(v):.2f}s" for c, v in res_many.items()),
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    if a.out:
        a.out.write_text(text)


if __name__ == "__main__":
    asyncio.run(main())
