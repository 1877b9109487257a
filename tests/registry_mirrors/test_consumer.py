"""The consumer's handle() on real directories: level-triggered, all or nothing, last good kept."""

from __future__ import annotations

import asyncio
import http.server
import json
import logging
import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from reloadd_registry_mirrors import HEADER

from reloadd import Ack, ConfigError, Reject, TransientError
from tests.reliability import Reliability

from .conftest import Env, ack_data, mirror_conf, rejected

pytestmark = pytest.mark.timeout(60)

GOOD_A = mirror_conf("registry.example.com", "127.0.0.1:5001")
GOOD_B = mirror_conf("registry.example.com", "127.0.0.1:5002")


def server_and_hosts(text: str) -> tuple[str, list[str]]:
    import tomllib

    doc = tomllib.loads(text)
    return doc["server"], list(doc.get("host", {}))


async def test_drop_in_renders_hosts_toml_and_acks_with_hosts(env: Env) -> None:
    c = env.consumer()
    drop = env.conf_d / "50-mirror.conf"
    drop.write_text(GOOD_A)
    results = await c.handle(env.batch(drop))
    assert results == {drop: Ack({"hosts": ["registry.example.com"], "warnings": []})}
    text = env.hosts_files()["registry.example.com/hosts.toml"]
    assert text.startswith(HEADER)
    assert server_and_hosts(text) == ("https://registry.example.com", ["http://127.0.0.1:5001"])
    assert c.stats["hosts_rendered"] == 1
    assert c.stats["config_valid"] == 1


async def test_change_then_break_then_fix_then_delete(env: Env, caplog: pytest.LogCaptureFixture) -> None:
    c = env.consumer()
    drop = env.conf_d / "50-mirror.conf"
    drop.write_text(GOOD_A)
    env.remember(await c.handle(env.batch(drop)))
    drop.write_text(GOOD_B)
    env.remember(await c.handle(env.batch(drop)))
    good = env.hosts_files()
    assert server_and_hosts(good["registry.example.com/hosts.toml"])[1] == ["http://127.0.0.1:5002"]

    drop.write_text(GOOD_A.replace("[[registry.mirror]]", "[[registry.mirror]"))
    with caplog.at_level(logging.ERROR, "reloadd.consumer.mirrors"):
        results = await c.handle(env.batch(drop))
    (result,) = results.values()
    assert isinstance(result, Reject)
    assert result.error.startswith(f"{drop}: invalid TOML")
    assert env.hosts_files() == good  # last good stays applied
    assert c.stats["config_valid"] == 0
    assert c.stats["reload_failures"] == 1
    assert any(str(drop) in r.getMessage() and "last good" in r.getMessage() for r in caplog.records)
    env.remember(results)

    # Another input changing while one is broken: acknowledged, but nothing is applied.
    other = env.conf_d / "60-other.conf"
    other.write_text(mirror_conf("quay.io", "127.0.0.1:5003"))
    results = await c.handle(env.batch(other))
    assert results == {other: Ack(None)}  # valid itself; nothing applied, so no data yet
    env.remember(results)
    assert env.hosts_files() == good
    assert env.triggered == []  # the broken file already carries its Reject

    drop.write_text(GOOD_A)
    results = await c.handle(env.batch(drop))
    assert isinstance(results[drop], Ack)
    assert env.triggered == [[other]]  # handed over again to refresh its data
    results = await c.handle(env.batch(other, forced=True))
    assert results == {other: Ack({"hosts": ["quay.io"], "warnings": []})}
    assert sorted(env.hosts_files()) == ["quay.io/hosts.toml", "registry.example.com/hosts.toml"]
    assert c.stats["config_valid"] == 1

    drop.unlink()
    results = await c.handle(env.batch(drop))
    assert results == {drop: Ack({"hosts": [], "warnings": []})}
    assert sorted(env.hosts_files()) == ["quay.io/hosts.toml"]
    assert not (env.hosts / "registry.example.com").exists()


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        ('[[registry]]\nlocation = "a.com"\ninsecure = "yes"\n', "key 'insecure' must be a boolean"),
        ('[registries.search]\nregistries = ["docker.io"]\n', "registry must be in v2 format but is in v1"),
        ('[[registry]]\nprefix = "a.com"\n', "location is unset"),
    ],
    ids=["wrong-type", "v1-drop-in", "rule"],
)
async def test_bad_input_is_rejected_and_nothing_moves(env: Env, content: str, fragment: str) -> None:
    c = env.consumer()
    good = env.conf_d / "10-good.conf"
    good.write_text(GOOD_A)
    env.remember(await c.handle(env.batch(good)))
    before_files = env.all_files()
    before = env.hosts_files()
    bad = env.conf_d / "50-bad.conf"
    bad.write_text(content)
    results = await c.handle(env.batch(bad))
    error = rejected(results[bad])
    assert error.startswith(str(bad))
    assert fragment in error
    assert env.hosts_files() == before
    assert env.all_files() == before_files | {bad}  # nothing written anywhere


async def test_oversized_file_is_rejected_unread(env: Env) -> None:
    c = env.consumer()
    good = env.conf_d / "10-good.conf"
    good.write_text(GOOD_A)
    env.remember(await c.handle(env.batch(good)))
    big = env.conf_d / "50-big.conf"
    big.write_bytes(b"# padding\n" * (1024 * 1024))  # 10 MiB of valid TOML comments
    results = await c.handle(env.batch(big))
    assert "file too large: 10485760 bytes, limit 1048576" in rejected(results[big])
    assert list(env.hosts_files()) == ["registry.example.com/hosts.toml"]


async def test_symlinked_drop_in_pointing_outside_is_refused(env: Env) -> None:
    c = env.consumer()
    outside = env.tmp / "elsewhere.conf"
    outside.write_text(GOOD_B)
    link = env.conf_d / "50-link.conf"
    link.symlink_to(outside)
    results = await c.handle(env.batch(link))
    assert "symlink points outside" in rejected(results[link])
    assert env.hosts_files() == {}


async def test_symlink_inside_the_folder_is_followed(env: Env) -> None:
    # A ConfigMap mount: x.conf -> ..data/x.conf -> ..2024_01/x.conf, all inside the folder.
    data = env.conf_d / "..2024_01"
    data.mkdir()
    (data / "50-cm.conf").write_text(GOOD_A)
    (env.conf_d / "..data").symlink_to("..2024_01")
    link = env.conf_d / "50-cm.conf"
    link.symlink_to("..data/50-cm.conf")
    results = await c_handle(env, link)
    assert isinstance(results[link], Ack)
    assert list(env.hosts_files()) == ["registry.example.com/hosts.toml"]


async def c_handle(env: Env, *paths: Path) -> Any:
    return await env.consumer().handle(env.batch(*paths))


async def test_main_file_and_lexical_drop_in_order(env: Env) -> None:
    env.main.write_text(mirror_conf("registry.example.com", "main.example.com", insecure=False))
    (env.conf_d / "20-b.conf").write_text(mirror_conf("registry.example.com", "b.example.com", insecure=False))
    (env.conf_d / "10-a.conf").write_text(mirror_conf("registry.example.com", "a.example.com", insecure=False))
    (env.conf_d / "30-c.conf.off").write_text(mirror_conf("registry.example.com", "off.example.com"))
    (env.conf_d / "sub").mkdir()
    (env.conf_d / "sub" / "99.conf").write_text(mirror_conf("registry.example.com", "sub.example.com"))
    results = await c_handle(env, env.main)
    assert results[env.main] == Ack({"hosts": [], "warnings": []})
    text = env.hosts_files()["registry.example.com/hosts.toml"]
    assert server_and_hosts(text)[1] == ["https://b.example.com"]
    assert "20-b.conf" in text.splitlines()[1]


async def test_unknown_key_is_warned_once_and_reported_in_ack(env: Env, caplog: pytest.LogCaptureFixture) -> None:
    c = env.consumer()
    drop = env.conf_d / "50.conf"
    drop.write_text(GOOD_A.replace("[[registry.mirror]]", "mirror_by_digest_only = true\n[[registry.mirror]]"))
    with caplog.at_level(logging.WARNING, "reloadd.consumer.mirrors"):
        results = await c.handle(env.batch(drop))
        await c.handle(env.batch(drop, forced=True))
    (warning,) = ack_data(results[drop])["warnings"]
    assert "unknown key 'mirror_by_digest_only' is ignored (did you mean 'mirror-by-digest-only'?)" in warning
    assert sum("mirror_by_digest_only" in r.getMessage() for r in caplog.records) == 1


async def test_registries_yaml_input(env: Env) -> None:
    c = env.consumer()
    env.yaml.write_text('mirrors:\n  "docker.io":\n    endpoint: ["http://127.0.0.1:5009"]\n')
    results = await c.handle(env.batch(env.yaml))
    assert ack_data(results[env.yaml])["hosts"] == ["docker.io"]
    text = env.hosts_files()["docker.io/hosts.toml"]
    assert server_and_hosts(text) == ("https://registry-1.docker.io", ["http://127.0.0.1:5009"])
    env.yaml.write_text("mirrors: [oops\n")
    results = await c.handle(env.batch(env.yaml))
    assert "invalid YAML" in rejected(results[env.yaml])
    assert "docker.io/hosts.toml" in env.hosts_files()


async def test_certificates_from_certs_dirs_are_listed(env: Env) -> None:
    certs = env.tmp / "containers-certs.d"
    (certs / "127.0.0.1:5001").mkdir(parents=True)
    for name in ("ca.crt", "client.cert", "client.key", "lonely.cert"):
        (certs / "127.0.0.1:5001" / name).write_text("pem")
    c = env.consumer(certs_dirs=[str(certs)])
    drop = env.conf_d / "50.conf"
    drop.write_text(GOOD_A)
    results = await c.handle(env.batch(drop))
    import tomllib

    entry = tomllib.loads(env.hosts_files()["registry.example.com/hosts.toml"])["host"]["http://127.0.0.1:5001"]
    d = certs / "127.0.0.1:5001"
    assert entry["ca"] == [str(d / "ca.crt")]
    assert entry["client"] == [[str(d / "client.cert"), str(d / "client.key")]]
    assert isinstance(results[drop], Ack)


async def test_start_renders_without_a_batch_and_asks_for_broken_files(env: Env) -> None:
    env.main.write_text("not toml [")
    (env.conf_d / "50.conf").write_text(GOOD_A)
    c = env.consumer()
    await c.start()
    assert env.hosts_files() == {}
    assert env.triggered == [[env.main]]  # so the engine hands it over and records the Reject
    env.main.write_text("")
    await c.start()
    assert list(env.hosts_files()) == ["registry.example.com/hosts.toml"]


async def test_stale_owned_directories_are_removed_at_start(env: Env) -> None:
    (env.hosts / "old.example.com").mkdir(parents=True)
    (env.hosts / "old.example.com" / "hosts.toml").write_text(HEADER + "\n")
    (env.hosts / "theirs.example.com").mkdir()
    (env.hosts / "theirs.example.com" / "hosts.toml").write_text("# theirs\n")
    await env.consumer().start()
    assert env.hosts_files() == {"theirs.example.com/hosts.toml": "# theirs\n"}


async def test_unwritable_hosts_dir_is_a_transient_error(env: Env) -> None:
    env.hosts.write_text("a file where the directory should be")
    c = env.consumer()
    drop = env.conf_d / "50.conf"
    drop.write_text(GOOD_A)
    with pytest.raises(TransientError, match="cannot write under"):
        await c.handle(env.batch(drop))


@pytest.mark.parametrize(
    ("options", "fragment"),
    [
        ({"hosts_dirr": "/x"}, "unknown key(s) 'hosts_dirr'"),
        ({"hosts_dir": 5}, "'hosts_dir' must be a string"),
        ({"notify": {"signal": "SIGNOPE", "pid": 1234}}, "unknown signal 'SIGNOPE'"),
        ({"notify": {"pid": 1}}, "pid"),
        ({"notify": {"url": "ftp://x"}}, "url must be http:// or https://"),
        ({"notify": {"commnd": ["x"]}}, "unknown key(s) 'commnd'"),
        ({"max_file_size": 0}, "must be at least 1"),
    ],
)
def test_options_are_validated(env: Env, options: dict[str, Any], fragment: str) -> None:
    with pytest.raises(ConfigError) as info:
        env.consumer(**options)
    assert fragment in str(info.value)


def test_roots_and_accepts(env: Env) -> None:
    c = env.consumer()
    assert list(c.roots) == [env.main, env.conf_d, env.yaml]
    assert c.accepts(env.main) and c.accepts(env.yaml) and c.accepts(env.conf_d / "x.conf")
    assert not c.accepts(env.conf_d / "x.conf.bak")
    assert not c.accepts(env.conf_d / "sub" / "x.conf")
    assert list(env.consumer(registries_yaml=None).roots) == [env.main, env.conf_d]


# -- notify -----------------------------------------------------------------------------------


async def test_notify_command_runs_after_a_change_only(env: Env) -> None:
    out = env.tmp / "notified"
    script = f'echo "$RELOADD_HOSTS" >> {out}'
    c = env.consumer(notify={"command": ["/bin/sh", "-c", script]})
    drop = env.conf_d / "50.conf"
    drop.write_text(GOOD_A)
    await c.handle(env.batch(drop))
    await c.handle(env.batch(drop, forced=True))  # nothing changed on disk: no notification
    assert out.read_text() == "registry.example.com\n"


async def test_notify_failure_is_counted_not_fatal(env: Env) -> None:
    c = env.consumer(notify={"command": ["/bin/sh", "-c", "echo boom >&2; exit 3"]})
    drop = env.conf_d / "50.conf"
    drop.write_text(GOOD_A)
    results = await c.handle(env.batch(drop))
    assert isinstance(results[drop], Ack)
    assert c.stats["notify_failures"] == 1
    assert "registry.example.com/hosts.toml" in env.hosts_files()


@pytest.fixture
def http_sink() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    received: list[dict[str, Any]] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            received.append(json.loads(body))
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/reload", received
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


async def test_notify_url_gets_a_json_post(env: Env, http_sink: tuple[str, list[dict[str, Any]]]) -> None:
    url, received = http_sink
    c = env.consumer(notify={"url": url})
    drop = env.conf_d / "50.conf"
    drop.write_text(GOOD_A)
    await c.handle(env.batch(drop))
    assert received == [{"hosts": ["registry.example.com"], "written": ["registry.example.com"], "removed": []}]


async def test_notify_signals_a_pid_from_a_pid_file(env: Env) -> None:
    got = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGUSR1, got.set)
    try:
        pid_file = env.tmp / "crio.pid"
        pid_file.write_text(f"{os.getpid()}\n")
        c = env.consumer(notify={"pid_file": str(pid_file), "signal": "SIGUSR1"})
        drop = env.conf_d / "50.conf"
        drop.write_text(GOOD_A)
        await c.handle(env.batch(drop))
        await asyncio.wait_for(got.wait(), 5)
    finally:
        loop.remove_signal_handler(signal.SIGUSR1)


@pytest.fixture
def signals_sent(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int, int]]:
    """Every way Python can send a signal, replaced by a recorder (as in tests/core/test_pidfile.py).

    A regression in the pid checks then records ``kill(-1, SIGUSR1)`` instead of signalling every
    process on the machine (the suite runs as root).
    """
    sent: list[tuple[str, int, int]] = []
    monkeypatch.setattr(os, "kill", lambda pid, sig: sent.append(("kill", pid, sig)))
    monkeypatch.setattr(os, "killpg", lambda pgid, sig: sent.append(("killpg", pgid, sig)))
    monkeypatch.setattr(signal, "pidfd_send_signal", lambda fd, sig, *a: sent.append(("pidfd", fd, sig)))
    return sent


@pytest.mark.parametrize("content", ["-1", "0", "1", "garbage", "99999999"])
async def test_notify_refuses_a_pid_file_naming_no_daemon(
    env: Env, content: str, caplog: pytest.LogCaptureFixture, signals_sent: list[tuple[str, int, int]],
    reliability: Reliability,
) -> None:
    """A pid file holding -1 would signal every process as root: refused, reported, nothing signalled."""
    pid_file = env.tmp / "crio.pid"
    pid_file.write_text(content + "\n")
    c = env.consumer(notify={"pid_file": str(pid_file), "signal": "SIGUSR1"})
    drop = env.conf_d / "50.conf"
    drop.write_text(GOOD_A)
    await c.handle(env.batch(drop))
    assert signals_sent == []
    assert c.stats["notify_failures"] == 1
    assert f"Refusing pid file {pid_file}" in caplog.text
    reliability.record(f"registry-mirrors: notify.pid_file holding {content!r}", trials=1, expected=0,
                       delivered=len(signals_sent),
                       notes=f"delivered = signals sent (recorded, never delivered); notify failures counted: "
                             f"{c.stats['notify_failures']:g}, logged naming the pid file")
