"""Every duration and number the config reader accepts is finite and in range.

Regression: ``quiet = nan`` (a bare TOML float) passed ``reloadd check``; the watch then
said "armed" while nothing was ever delivered, because every ``now >= last + nan`` is false.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from reloadd import ConfigError, Options, parse_duration
from reloadd._config import load_config

pytestmark = pytest.mark.timeout(60)

# (TOML value text, what the error must say)
BAD_DURATIONS = [
    ("nan", "expected a duration"),
    ("+nan", "expected a duration"),
    ("-nan", "expected a duration"),
    ("inf", "at most"),
    ("-inf", "must not be negative"),
    ('"nan"', "expected a duration"),
    ('"inf"', "expected a duration"),
    ('"infs"', "expected a duration"),
    ('"-1s"', "expected a duration"),
    ("-1", "must not be negative"),
    ("-0.5", "must not be negative"),
    ('"99999999999999h"', "at most"),  # 30d, or 1h for quiet
    ("1e300", "at most"),
    ('"721h"', "at most"),
]

GLOBAL_KEYS = ["quiet", "max_delay", "rescan_interval", "full_rescan_interval", "shutdown_grace", "ready_max_age"]


def write(tmp_path: Path, body: str) -> Path:
    p = tmp_path / "reloadd.toml"
    p.write_text(textwrap.dedent(body))
    return p


@pytest.mark.parametrize("key", GLOBAL_KEYS)
@pytest.mark.parametrize(("value", "message"), BAD_DURATIONS)
def test_global_durations_must_be_finite_and_in_range(tmp_path, key, value, message):
    p = write(tmp_path, f"[reloadd]\n{key} = {value}\n")
    with pytest.raises(ConfigError) as err:
        load_config(p)
    text = str(err.value)
    assert f"reloadd.toml [reloadd]: key {key!r}" in text, text
    assert message in text or "must not be less than" in text, text


@pytest.mark.parametrize("key", ["quiet", "max_delay"])
@pytest.mark.parametrize(("value", "message"), BAD_DURATIONS)
def test_consumer_durations_must_be_finite_and_in_range(tmp_path, key, value, message):
    p = write(tmp_path, f'[[consumer]]\nname = "x"\nplugin = "exec"\n{key} = {value}\n')
    with pytest.raises(ConfigError) as err:
        load_config(p)
    text = str(err.value)
    assert f"reloadd.toml [[consumer]] #1 ('x'): key {key!r}" in text, text
    assert message in text, text


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ('[reloadd]\nquiet = "2h"\nmax_delay = "3h"\n', "key 'quiet': duration must be at most 1h"),
        ('[reloadd]\nrescan_interval = "1ms"\n', "key 'rescan_interval' must be 0 (off) or at least 100ms"),
        ('[reloadd]\nready_max_age = "0"\n', "key 'ready_max_age': duration must be at least 1s"),
        ('[[consumer]]\nname = "x"\nplugin = "exec"\nconcurrency = 9223372036854775807\n',
         "('x'): key 'concurrency' must be at most 1024"),
        ('[[consumer]]\nname = "x"\nplugin = "exec"\nconcurrency = 0\n', "('x'): key 'concurrency' must be at least 1"),
        # a consumer's own quiet is held against the max_delay it inherits, and the reverse
        ('[[consumer]]\nname = "x"\nplugin = "exec"\nquiet = "10s"\n',
         "[[consumer]] #1 ('x'): max_delay (5s) must not be less than quiet (10s)"),
        ('[reloadd]\nquiet = "1s"\n[[consumer]]\nname = "x"\nplugin = "exec"\nmax_delay = "500ms"\n',
         "[[consumer]] #1 ('x'): max_delay (0.5s) must not be less than quiet (1s)"),
    ],
)
def test_ranges_beyond_finite(tmp_path, body, message):
    with pytest.raises(ConfigError) as err:
        load_config(write(tmp_path, body))
    assert "reloadd.toml" in str(err.value)
    assert message in str(err.value)


def test_edges_that_stay_valid(tmp_path):
    cfg = load_config(write(tmp_path, """
        [reloadd]
        quiet = "0"
        max_delay = "720h"
        rescan_interval = 0
        shutdown_grace = 0.0
        ready_max_age = "1s"
        [[consumer]]
        name = "x"
        plugin = "exec"
        quiet = "1h"
        concurrency = 1024
    """))
    assert (cfg.quiet, cfg.max_delay, cfg.rescan_interval, cfg.shutdown_grace, cfg.ready_max_age) == (
        0.0, 720 * 3600.0, 0.0, 0.0, 1.0)
    assert cfg.consumers[0].quiet == 3600.0 and cfg.consumers[0].concurrency == 1024


def test_plugin_options_get_the_same_checks():
    """Plugins read their options through the same reader, so they inherit the checks."""
    opts = Options({"timeout": float("nan"), "ratio": float("inf"), "n": float("nan")}, where="f.toml consumer 'c'")
    with pytest.raises(ConfigError, match=r"f\.toml consumer 'c': key 'timeout': expected a duration"):
        opts.duration("timeout", 1.0)
    with pytest.raises(ConfigError, match=r"f\.toml consumer 'c': key 'ratio' must be a finite number"):
        opts.number("ratio")
    with pytest.raises(ConfigError, match=r"key 'n' must be a finite number"):
        opts.number("n", minimum=0.0)
    ok = Options({"r": 2, "t": "90s"}, where="f.toml")
    assert ok.number("r", maximum=2.0) == 2.0 and ok.duration("t", maximum=90.0) == 90.0
    with pytest.raises(ConfigError, match=r"key 'r' must be at most 1"):
        Options({"r": 2}, where="f.toml").number("r", maximum=1.0)
    with pytest.raises(ConfigError, match=r"f\.toml: key 't': duration must be at least 2m"):
        Options({"t": "90s"}, where="f.toml").duration("t", minimum=120.0)
    assert parse_duration(0, "x") == 0.0


@pytest.mark.parametrize("value", ["nan", "inf", '"infs"', "-1"])
def test_check_refuses_non_finite_quiet(tmp_path, value, reliability):
    p = write(tmp_path, f"[reloadd]\nstate_dir = \"{tmp_path / 's'}\"\nquiet = {value}\n")
    out = subprocess.run([sys.executable, "-m", "reloadd", "check", "--config", str(p)],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 2, out.stdout + out.stderr
    assert f"{p} [reloadd]: key 'quiet'" in out.stderr
    accepted = int(out.returncode == 0 or "OK" in out.stdout)  # the config got through
    reliability.record(f"`reloadd check` with quiet = {value}", trials=1, expected=0, delivered=accepted,
                       notes=f"exit {out.returncode}: `…[reloadd]: "
                             f"{out.stderr.strip().split('[reloadd]: ', 1)[-1][:100]}`")


def plugin_config(tmp_path: Path, plugin: str, options: str) -> Path:
    return write(tmp_path, f"""
        [reloadd]
        state_dir = "{tmp_path / 's'}"
        [[consumer]]
        name = "x"
        plugin = "{plugin}"
        paths = ["{tmp_path}"]
        [consumer.options]
        {options}
    """)


def check(p: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "reloadd", "check", "--config", str(p)],
                          capture_output=True, text=True, timeout=30)


# Plugin integers are capped: a typo such as `parallel = 1000000000` is an error, not a billion tasks.
PLUGIN_BOUNDS = [
    ("kube-manifests", "parallel = 1000000000", "key 'parallel' must be at most 256, got 1000000000"),
    ("kube-manifests", "concurrency = 65", "key 'concurrency' must be at most 64, got 65"),
    ("kube-manifests", "max_file_size = 1073741825", "key 'max_file_size' must be at most 1073741824"),
    ("containerd-images", "concurrency = 100000", "key 'concurrency' must be at most 64, got 100000"),
    ("registry-mirrors", "max_file_size = 9223372036854775807", "key 'max_file_size' must be at most 1073741824"),
]


@pytest.mark.parametrize(("plugin", "option", "message"), PLUGIN_BOUNDS)
def test_check_refuses_plugin_integers_out_of_range(tmp_path, plugin, option, message):
    p = plugin_config(tmp_path, plugin, option)
    out = check(p)
    assert out.returncode != 0, out.stdout + out.stderr
    assert f"reloadd: {p}: consumer 'x' options: {message}" in out.stderr, out.stderr


@pytest.mark.parametrize(("plugin", "option"), [
    ("kube-manifests", "parallel = 256\nconcurrency = 64\nmax_file_size = 1073741824"),
    ("containerd-images", "concurrency = 64"),
    ("registry-mirrors", "max_file_size = 1073741824"),
])
def test_plugin_integers_at_their_maximum_stay_valid(tmp_path, plugin, option):
    out = check(plugin_config(tmp_path, plugin, option))
    assert out.returncode == 0, out.stderr


def test_a_bad_plugin_option_names_the_config_file(tmp_path):
    """`check` and `run` both put the file in front of a plugin's own ``consumer 'x' options: key …``."""
    p = plugin_config(tmp_path, "exec", 'command = ["true"]\ntimeout = "soon"')
    out = check(p)
    expected = f"{p}: consumer 'x' options: key 'timeout': expected a duration"
    assert out.returncode == 1 and f"reloadd: {expected}" in out.stderr, out.stderr
    run = subprocess.run([sys.executable, "-m", "reloadd", "run", "--config", str(p)],
                         capture_output=True, text=True, timeout=30)
    assert run.returncode == 1 and expected in run.stderr, run.stderr


@pytest.mark.parametrize(("rescan", "full", "every"), [
    ("15s", "60s", 4),  # the defaults: one full rescan a minute
    ("15s", "61s", 4),  # never further apart than asked: 4 x 15 s
    ("15s", "20s", 1),  # less than two intervals: every rescan is full
    ("15s", "0s", 1),
    ("0s", "60s", 1),  # no periodic rescans at all
])
def test_full_rescans_are_never_further_apart_than_asked(tmp_path, rescan, full, every):
    cfg = load_config(write(tmp_path, f'[reloadd]\nrescan_interval = "{rescan}"\nfull_rescan_interval = "{full}"\n'))
    assert cfg.full_rescan_every == every
    if every > 1:
        assert every * cfg.rescan_interval <= cfg.full_rescan_interval
