"""The ``registry-mirrors`` consumer's configuration: its options, read once and validated.

Named so it sorts before ``_notify.py``: the reference generator lists option reads file by file, and the
``notify.*`` rows stay after the consumer's own, as before the move out of ``_consumer.py``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from reloadd import ConsumerContext, Options

from ._inputs import FOLLOW_INSIDE, FOLLOW_ROOT_OWNED, Inputs
from ._notify import Notifier

__all__ = ["MAX_FILE_SIZE", "Settings"]

MAX_FILE_SIZE = 1 << 30
"""The largest ``max_file_size`` accepted (1 GiB): every input is read and parsed in memory, whole."""


@dataclass(frozen=True, slots=True)
class Settings:
    """The consumer's options, validated.

    Attributes:
        inputs: registries.conf, registries.conf.d, registries.yaml, certs dirs, size limit.
        hosts_dir: Where hosts.toml directories are written (containerd's ``config_path`` root).
        containerd_config: containerd's config.toml to check at start-up (``None``: skip).
        notify: The action after each apply that changed something.
    """

    inputs: Inputs
    hosts_dir: Path
    containerd_config: Path | None
    notify: Notifier

    @classmethod
    def from_context(cls, ctx: ConsumerContext) -> Settings:
        """Read ``ctx.options`` strictly (unknown keys are a :class:`reloadd.ConfigError`).

        The consumer's roots come from these options (``paths`` is not used).

        Options:
            registries_conf: The main containers-registries.conf(5) file; may be absent.
            registries_conf_d: Its drop-in folder (``*.conf`` directly in it, in lexical order); may be absent.
            registries_yaml: A k3s-style ``registries.yaml`` read after them (absent: none).
            hosts_dir: Where ``<host>/hosts.toml`` files are written (containerd's ``config_path``).
            certs_dirs: Folders of ``<host>/*.crt``, ``*.cert`` + ``*.key`` files listed as ``ca`` and
                ``client`` in hosts.toml.
            containerd_config: containerd's config.toml to check at start-up for a matching ``config_path``
                (``""`` skips the check).
            max_file_size: Bytes; larger inputs are rejected unread.
            follow_symlinks: ``inside``: a symlinked drop-in must resolve inside the drop-in folder
                (ConfigMap mounts); ``root-owned``: anywhere, if every link and the file are owned by root
                (NixOS).
            notify: The optional action after an apply that changed files (one of ``command``, ``url``,
                ``pid``/``pid_file``).
        """
        where = f"consumer {ctx.name!r} options"
        base = ctx.config_file.parent if ctx.config_file else None
        opts = Options(ctx.options, where=where)
        main = opts.path("registries_conf", "/etc/containers/registries.conf", base=base)
        conf_d = opts.path("registries_conf_d", "/etc/containers/registries.conf.d", base=base)
        yaml = opts.path("registries_yaml", None, base=base)
        hosts_dir = opts.path("hosts_dir", "/etc/containerd/certs.d", base=base)
        certs = opts.str_list("certs_dirs", ["/etc/containers/certs.d", "/etc/docker/certs.d"])
        containerd_config = opts.str("containerd_config", "/etc/containerd/config.toml")
        max_size = opts.int("max_file_size", 1 << 20, minimum=1, maximum=MAX_FILE_SIZE)
        follow = opts.choice("follow_symlinks", (FOLLOW_INSIDE, FOLLOW_ROOT_OWNED), FOLLOW_INSIDE)
        notify = Notifier.from_options(opts.table("notify"), f"{where} notify")
        opts.finish()
        return cls(
            Inputs(main, conf_d, yaml, tuple(Path(c) for c in certs), max_size, follow),
            hosts_dir,
            Path(containerd_config) if containerd_config else None,
            notify,
        )
