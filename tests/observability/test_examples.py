"""examples/reloadd.toml and examples/systemd/reloadd.service are valid and agree with each other."""

from __future__ import annotations

import dataclasses
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

from reloadd import Config, load_config

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
UNIT = EXAMPLES / "systemd" / "reloadd.service"


def unit_directives() -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for line in UNIT.read_text().splitlines():
        if line and not line.startswith(("#", "[")) and "=" in line:
            key, _, value = line.partition("=")
            out.setdefault(key, []).append(value)
    return out


def test_example_config_documents_every_setting_and_checks_ok() -> None:
    cfg = load_config(EXAMPLES / "reloadd.toml")
    keys = set(tomllib.loads((EXAMPLES / "reloadd.toml").read_text())["reloadd"])
    fields = {f.name for f in dataclasses.fields(Config)} - {"consumers", "source"}
    assert keys == fields
    assert [(c.plugin, c.after) for c in cfg.consumers] == [
        ("registry-mirrors", ()), ("containerd-images", ("mirrors",)), ("kube-manifests", ("images",))]
    assert cfg.metrics_listen is not None and cfg.metrics_listen.startswith("127.0.0.1:")
    proc = subprocess.run([sys.executable, "-m", "reloadd", "check", "--config", str(EXAMPLES / "reloadd.toml")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr


def test_systemd_unit_is_type_notify_with_watchdog_and_reload() -> None:
    d = unit_directives()
    assert d["Type"] == ["notify"]
    assert d["WatchdogSec"] and d["NotifyAccess"] == ["main"]
    assert d["ExecReload"] == ["/bin/kill -HUP $MAINPID"]
    assert any(" run --config /etc/reloadd/reloadd.toml" in v for v in d["ExecStart"])
    # the directories systemd creates are the ones the example config uses
    cfg = load_config(EXAMPLES / "reloadd.toml")
    assert d["RuntimeDirectory"] == ["reloadd"] and cfg.control_socket == Path("/run/reloadd/control.sock")
    assert d["StateDirectory"] == ["reloadd"] and cfg.state_dir == Path("/var/lib/reloadd")
    rw = d["ReadWritePaths"][0].split()
    assert "/etc/containerd/certs.d" in rw and "/var/lib/reloadd" in rw
    families = d["RestrictAddressFamilies"][0].split()
    assert "AF_UNIX" in families  # containerd's socket, sd_notify, the control socket


def test_systemd_unit_passes_systemd_analyze_verify(tmp_path: Path) -> None:
    assert shutil.which("systemd-analyze"), "systemd-analyze missing: install Debian's systemd (make deps)"
    reloadd = shutil.which("reloadd") or str(Path(sys.executable).parent / "reloadd")
    unit = tmp_path / "reloadd.service"
    unit.write_text(UNIT.read_text().replace("/usr/bin/reloadd", reloadd))
    proc = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stderr.strip() == "", proc.stderr
