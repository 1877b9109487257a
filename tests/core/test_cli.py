"""The command line: check names what is wrong; reload signals the running daemon."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import textwrap

import pytest

from tests.daemon_config import hook_daemon_config

pytestmark = pytest.mark.timeout(60)


def reloadd(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "reloadd", *args], capture_output=True, text=True, timeout=30)


def test_check_ok_and_errors(tmp_path):
    good = tmp_path / "good.toml"
    good.write_text(textwrap.dedent("""
        [[consumer]]
        name = "hook"
        plugin = "exec"
        paths = ["."]
        [consumer.options]
        command = ["true"]
    """))
    out = reloadd("check", "--config", str(good))
    assert out.returncode == 0, out.stderr
    assert "OK (1 consumer(s))" in out.stdout

    bad = tmp_path / "bad.toml"
    bad.write_text(textwrap.dedent("""
        [[consumer]]
        name = "hook"
        plugin = "exec"
        [consumer.options]
        comand = ["true"]
        [[consumer]]
        name = "other"
        plugin = "no-such-plugin"
    """))
    out = reloadd("check", "--config", str(bad))
    assert out.returncode == 1
    assert "consumer 'hook' options: 'command' must be a non-empty list" in out.stderr
    assert "No plugin named 'no-such-plugin'" in out.stderr and "exec" in out.stderr

    broken = tmp_path / "broken.toml"
    broken.write_text("[reloadd]\nquiet = 'soon'\n")
    out = reloadd("check", "--config", str(broken))
    assert out.returncode == 2
    assert "broken.toml [reloadd]: key 'quiet'" in out.stderr


async def test_run_reload_and_json_logs(tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    (root / "a.conf").write_text("a")
    out = tmp_path / "batches.jsonl"
    cfg = hook_daemon_config(tmp_path, root, command=["sh", "-c", f"cat >> {out}; echo >> {out}"],
                             pid_file=tmp_path / "reloadd.pid")
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "reloadd", "--log-format", "json", "run", "--config", str(cfg),
        stderr=asyncio.subprocess.PIPE,
    )

    async def batches(n: int) -> list[dict]:
        for _ in range(200):
            if out.exists():
                docs = [json.loads(x) for x in out.read_text().splitlines() if x.strip()]
                if len(docs) >= n:
                    return docs
            await asyncio.sleep(0.05)  # the hook is another process writing a file
        raise TimeoutError(n)

    try:
        first = await batches(1)
        assert first[0]["reason"] == "startup"
        assert first[0]["changes"][0]["kind"] == "added"
        for _ in range(100):
            if (tmp_path / "reloadd.pid").exists():
                break
            await asyncio.sleep(0.05)
        res = await asyncio.to_thread(reloadd, "reload", "--config", str(cfg))
        assert res.returncode == 0, res.stderr
        second = await batches(2)
        assert second[1]["reason"] == "signal"
        assert second[1]["changes"][0]["path"] == str(root / "a.conf")
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 0
    lines = [json.loads(x) for x in err.decode().splitlines() if x.startswith("{")]
    assert lines and all({"time", "level", "logger", "message"} <= set(x) for x in lines)
    assert not (tmp_path / "reloadd.pid").exists()


def test_version_and_a_help_written_for_users():
    out = reloadd("--version")
    assert out.returncode == 0 and out.stdout.startswith("reloadd ") and out.stdout.split()[1][0].isdigit()
    helped = reloadd("--help")
    assert helped.returncode == 0
    assert "keeps a Kubernetes node in step with files" in helped.stdout
    assert "The only place" not in helped.stdout  # the module's developer docstring is not the help


def test_a_misspelt_key_an_option_and_a_plugin_get_a_suggestion_naming_the_file(tmp_path):
    cfg = tmp_path / "reloadd.toml"
    cfg.write_text('[reloadd]\nqiuet = "100ms"\nstate_dir = ""\n')
    out = reloadd("check", "--config", str(cfg))
    assert out.returncode != 0 and "'qiuet' (did you mean 'quiet'?)" in out.stderr and str(cfg) in out.stderr

    cfg.write_text(textwrap.dedent("""
        [reloadd]
        state_dir = ""
        [[consumer]]
        name = "hook"
        plugin = "exec"
        paths = ["."]
        [consumer.options]
        command = ["true"]
        timout = "5s"
    """))
    out = reloadd("check", "--config", str(cfg))
    assert out.returncode == 1 and "(did you mean 'timeout'?)" in out.stderr and str(cfg) in out.stderr

    cfg.write_text(textwrap.dedent("""
        [reloadd]
        state_dir = ""
        [[consumer]]
        name = "hook"
        plugin = "exce"
        paths = ["."]
    """))
    out = reloadd("check", "--config", str(cfg))
    assert out.returncode == 1 and "No plugin named 'exce' (did you mean 'exec'?)" in out.stderr
    assert str(cfg) in out.stderr

    cfg.write_text(textwrap.dedent("""
        [reloadd]
        state_dir = ""
        [[consumer]]
        name = "images"
        plugin = "exec"
        paths = ["."]
        [consumer.options]
        command = ["true"]
        [[consumer]]
        name = "manifests"
        plugin = "exec"
        paths = ["."]
        after = ["imagse"]
        [consumer.options]
        command = ["true"]
    """))
    out = reloadd("check", "--config", str(cfg))
    assert out.returncode != 0 and "(did you mean 'images'?)" in out.stderr
