"""The start-up config_path check on each release's own default config (``containerd config default``).

The default configs are material nobody here wrote: 1.6 and 1.7 print a version-2 file with the CRI
registry under ``io.containerd.grpc.v1.cri``; 2.x prints version 3 with it under
``io.containerd.cri.v1.images`` (single-quoted table keys). The check must find the table in each, say
what to add where, and be quiet once ``config_path`` names ``hosts_dir``.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
from reloadd_registry_mirrors._containerd import check_config

from tests.infra import get_release, releases_under_test

TABLE = {"1.6": "io.containerd.grpc.v1.cri", "1.7": "io.containerd.grpc.v1.cri", "2.x": "io.containerd.cri.v1.images"}


def _default_config(release: str) -> str:
    rel = get_release(release)
    rel.check()
    out = subprocess.run([rel.binary("containerd"), "config", "default"], capture_output=True, text=True, check=True)
    return out.stdout


@pytest.mark.parametrize("release", releases_under_test())
def test_check_reads_each_releases_default_config(release: str, tmp_path: Path) -> None:
    text = _default_config(release)
    hosts_dir = tmp_path / "certs.d"
    cfg = tmp_path / "config.toml"
    cfg.write_text(text)
    res = check_config(cfg, hosts_dir)
    assert not res.reads_hosts_dir
    assert len(res.warnings) == 1
    assert TABLE[release] in res.warnings[0] and str(hosts_dir) in res.warnings[0]

    # The edit the warning asks for, made in the release's own file, silences it.
    pattern = re.compile(
        r"^(\s*\[plugins\.[\"']" + re.escape(TABLE[release]) + r"[\"']\.registry\]\n\s*)config_path = ['\"]{2}", re.M
    )
    edited, n = pattern.subn(lambda m: f"{m.group(1)}config_path = '{hosts_dir}'", text)
    assert n == 1, "the default config no longer has the registry table where the docs say"
    cfg.write_text(edited)
    res = check_config(cfg, hosts_dir)
    assert res.warnings == [] and res.reads_hosts_dir
