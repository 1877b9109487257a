"""The start-up check of containerd's config.toml and of shadowing host directories."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from reloadd_registry_mirrors._containerd import check_config, shadowing

from .conftest import Env, mirror_conf


def cfg(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "config.toml"
    path.write_text(text)
    return path


def test_v2_config_pointing_at_hosts_dir_is_fine(tmp_path: Path) -> None:
    hosts = tmp_path / "certs.d"
    check = check_config(
        cfg(
            tmp_path,
            f'version = 2\n[plugins."io.containerd.grpc.v1.cri".registry]\nconfig_path = "{hosts}"\n',
        ),
        hosts,
    )
    assert (check.warnings, check.reads_hosts_dir, check.roots_before) == ([], True, [])


def test_missing_config_path_says_the_one_restart_needed(tmp_path: Path) -> None:
    hosts = tmp_path / "certs.d"
    (warning,) = check_config(cfg(tmp_path, "version = 2\n"), hosts).warnings
    assert f'add config_path = "{hosts}"' in warning
    assert '[plugins."io.containerd.grpc.v1.cri".registry]' in warning
    assert "restart containerd once" in warning


def test_config_path_elsewhere_is_reported(tmp_path: Path) -> None:
    text = 'version = 2\n[plugins."io.containerd.grpc.v1.cri".registry]\nconfig_path = "/etc/docker/certs.d"\n'
    (warning,) = check_config(cfg(tmp_path, text), tmp_path / "certs.d").warnings
    assert 'config_path = "/etc/docker/certs.d", which does not include' in warning


def test_v3_default_config_path_and_roots_before(tmp_path: Path) -> None:
    check = check_config(cfg(tmp_path, "version = 3\n"), Path("/etc/docker/certs.d"))
    assert check.warnings == []
    assert check.roots_before == [Path("/etc/containerd/certs.d")]


def test_legacy_mirrors_next_to_config_path(tmp_path: Path) -> None:
    hosts = tmp_path / "certs.d"
    text = (
        f'version = 2\n[plugins."io.containerd.grpc.v1.cri".registry]\nconfig_path = "{hosts}"\n'
        '[plugins."io.containerd.grpc.v1.cri".registry.mirrors."docker.io"]\nendpoint = ["https://m"]\n'
    )
    (warning,) = check_config(cfg(tmp_path, text), hosts).warnings
    assert "which containerd refuses at start-up" in warning


def test_unreadable_or_missing_config(tmp_path: Path) -> None:
    assert "not found" in check_config(tmp_path / "nope.toml", tmp_path).warnings[0]
    assert "cannot read" in check_config(cfg(tmp_path, "version = [\n"), tmp_path).warnings[0]


def test_shadowing_by_earlier_root_default_and_port_dir(tmp_path: Path) -> None:
    first, hosts = tmp_path / "first", tmp_path / "hosts"
    (first / "_default").mkdir(parents=True)
    (hosts / "b.com_5000_").mkdir(parents=True)
    warnings = shadowing(hosts, [first], ["a.com"])
    assert warnings == [
        f"{first / '_default'} shadows {hosts / 'a.com'}: containerd uses the first config_path root "
        "with any match, so the rendered mirrors are not used"
    ]
    assert shadowing(hosts, [], ["b.com:5000", "c.com"]) == [
        f"{hosts / 'b.com_5000_'} shadows {hosts / 'b.com:5000'}: containerd reads host_port_ first"
    ]


async def test_start_logs_the_check(env: Env, caplog: pytest.LogCaptureFixture) -> None:
    first = env.tmp / "first"
    (first / "registry.example.com").mkdir(parents=True)
    config = cfg(
        env.tmp,
        f'version = 2\n[plugins."io.containerd.grpc.v1.cri".registry]\nconfig_path = "{first}:{env.hosts}"\n',
    )
    (env.conf_d / "50.conf").write_text(mirror_conf("registry.example.com", "127.0.0.1:5001"))
    with caplog.at_level(logging.WARNING, "reloadd.consumer.mirrors"):
        await env.consumer(containerd_config=str(config)).start()
    messages = [r.getMessage() for r in caplog.records]
    assert messages == [
        f"{first / 'registry.example.com'} shadows {env.hosts / 'registry.example.com'}: containerd uses the "
        "first config_path root with any match, so the rendered mirrors are not used"
    ]
