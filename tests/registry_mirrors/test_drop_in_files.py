"""Which entries of registries.conf.d are read: directories skipped, symlinks by policy."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from reloadd import Ack, ConfigError
from tests.reliability import Reliability

from .conftest import Env, mirror_conf, rejected

pytestmark = pytest.mark.timeout(60)

HOST = "registry.example.com"
GOOD = mirror_conf(HOST, "127.0.0.1:5001")
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to own (and chown) the files")


async def test_directory_named_like_a_drop_in_is_skipped(env: Env, reliability: Reliability) -> None:
    # containers/image walks the folder and skips directories (without recursing into them).
    directory = env.conf_d / "40-dir.conf"
    directory.mkdir()
    (directory / "99.conf").write_text(mirror_conf("quay.io", "127.0.0.1:5009"))
    drop = env.conf_d / "50.conf"
    drop.write_text(GOOD)
    c = env.consumer()
    results = await c.handle(env.batch(directory, drop))
    assert results == {directory: Ack({"hosts": [], "warnings": []}), drop: Ack({"hosts": [HOST], "warnings": []})}
    written = list(env.hosts_files())
    assert written == [f"{HOST}/hosts.toml"]
    assert c.stats["config_valid"] == 1
    reliability.record("registry-mirrors: a directory named 40-dir.conf (holding 99.conf) beside a drop-in",
                       trials=1, expected=1, delivered=len(written),
                       notes=f"hosts.toml written: {', '.join(w.split('/')[0] for w in written)} (none from the "
                             "99.conf inside the directory, which is acked and skipped as containers/image does)")


async def test_symlink_to_a_directory_is_still_refused(env: Env) -> None:
    # containers/image lists it (WalkDir does not follow it) and then fails to read it.
    (env.conf_d / "sub").mkdir()
    link = env.conf_d / "45-link.conf"
    link.symlink_to("sub")
    results = await env.consumer().handle(env.batch(link))
    assert rejected(results[link]) == f"{link}: cannot read: Is a directory"


def nixos_layout(env: Env) -> tuple[Path, Path, Path]:
    """conf.d/50-mirror.conf -> etc-static/50-mirror.conf -> nix/store/abc-50-mirror.conf, as on NixOS."""
    store = env.tmp / "nix" / "store" / "abc-50-mirror.conf"
    store.parent.mkdir(parents=True)
    store.write_text(GOOD)
    hop = env.tmp / "etc-static" / "50-mirror.conf"
    hop.parent.mkdir()
    hop.symlink_to(store)
    link = env.conf_d / "50-mirror.conf"
    link.symlink_to(hop)
    return link, hop, store


async def test_symlink_leaving_the_folder_is_refused_by_default(env: Env) -> None:
    link, _, store = nixos_layout(env)
    results = await env.consumer().handle(env.batch(link))
    assert rejected(results[link]) == f"{link}: symlink points outside {env.conf_d} (to {store}); refused"
    assert env.hosts_files() == {}


@needs_root
async def test_root_owned_symlink_chain_is_followed_when_enabled(env: Env, reliability: Reliability) -> None:
    link, _, _ = nixos_layout(env)
    c = env.consumer(follow_symlinks="root-owned")
    results = await c.handle(env.batch(link))
    assert results[link] == Ack({"hosts": [HOST], "warnings": []})
    written = list(env.hosts_files())
    assert written == [f"{HOST}/hosts.toml"]
    reliability.record("registry-mirrors: follow_symlinks = root-owned, NixOS-like chain all root's", trials=1,
                       expected=1, delivered=len(written), notes="delivered = hosts.toml written from the target")


@needs_root
@pytest.mark.parametrize("which", ["link", "hop", "target"])
async def test_symlink_chain_not_wholly_root_owned_is_refused(env: Env, which: str) -> None:
    link, hop, store = nixos_layout(env)
    victim = {"link": link, "hop": hop, "target": store}[which]
    os.chown(victim, 1000, 1000, follow_symlinks=False)
    results = await env.consumer(follow_symlinks="root-owned").handle(env.batch(link))
    error = rejected(results[link])
    assert error.startswith(f"{link}: ")
    assert f"{victim} " in error
    assert "is owned by uid 1000, not root; refused" in error
    assert env.hosts_files() == {}


def test_follow_symlinks_option_is_validated(env: Env) -> None:
    with pytest.raises(ConfigError, match="'follow_symlinks' must be one of 'inside', 'root-owned', got 'always'"):
        env.consumer(follow_symlinks="always")


def directory_link_layout(env: Env) -> tuple[Path, Path, Path]:
    """conf.d/50-mirror.conf -> sl/mid/50-mirror.conf, where ``mid`` is itself a symlink to real/."""
    real = env.tmp / "sl" / "real"
    real.mkdir(parents=True)
    target = real / "50-mirror.conf"
    target.write_text(GOOD)
    mid = env.tmp / "sl" / "mid"
    mid.symlink_to("real")
    link = env.conf_d / "50-mirror.conf"
    link.symlink_to(mid / "50-mirror.conf")
    return link, mid, target


@needs_root
async def test_directory_symlink_inside_the_target_path_must_be_root_owned(
    env: Env, reliability: Reliability
) -> None:
    """Every symlink met while resolving counts, not only the links the drop-in chain starts with."""
    link, mid, _ = directory_link_layout(env)
    os.lchown(mid, 1000, 1000)
    results = await env.consumer(follow_symlinks="root-owned").handle(env.batch(link))
    error = rejected(results[link])
    assert error.startswith(f"{link}: ")
    assert f"symlink {mid} " in error and "is owned by uid 1000, not root; refused" in error, error
    written = env.hosts_files()
    assert written == {}
    reliability.record("registry-mirrors: root-owned, a uid-1000 directory symlink inside the link's target path",
                       trials=1, expected=0, delivered=len(written),
                       notes="delivered = hosts.toml written from it; rejected naming the drop-in and the link")


@needs_root
async def test_all_root_chain_through_a_directory_symlink_is_followed(env: Env) -> None:
    link, _, _ = directory_link_layout(env)
    results = await env.consumer(follow_symlinks="root-owned").handle(env.batch(link))
    assert results[link] == Ack({"hosts": [HOST], "warnings": []})
    assert list(env.hosts_files()) == [f"{HOST}/hosts.toml"]


async def test_a_directory_symlink_that_leads_outside_is_refused_by_default(env: Env) -> None:
    # conf.d/50.conf -> sub/50.conf looks inside, but conf.d/sub is a link to a folder elsewhere.
    link, mid, target = directory_link_layout(env)
    link.unlink()
    (env.conf_d / "sub").symlink_to(mid)
    link.symlink_to("sub/50-mirror.conf")
    results = await env.consumer().handle(env.batch(link))
    assert rejected(results[link]) == f"{link}: symlink points outside {env.conf_d} (to {target}); refused"


async def test_a_symlink_loop_is_refused(env: Env) -> None:
    loop = env.conf_d / "60-loop.conf"
    loop.symlink_to("60-loop.conf")
    results = await env.consumer(follow_symlinks="root-owned").handle(env.batch(loop))
    assert rejected(results[loop]) == f"{loop}: more than 40 symlinks on the way; refused"
