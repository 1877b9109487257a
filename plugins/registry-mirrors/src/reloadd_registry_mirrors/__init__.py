"""reloadd ``registry-mirrors``: containers-registries.conf(5) mirrors → containerd hosts.toml, live.

The pipeline is pure up to the writer, so each step can be used on its own::

    config = merge(load_file(main, data, drop_in=False), [load_file(p, d, drop_in=True) for p, d in drop_ins])
    rendered = render(config)           # {host dir: hosts.toml text} + warnings
    apply(hosts_dir, rendered.files)    # atomic writes, owned directories only
"""

from __future__ import annotations

from reloadd import ConsumerContext

from ._config import Settings
from ._consumer import RegistryMirrorsConsumer
from ._hosts import is_valid_host
from ._inputs import Inputs, Outcome, Snapshot, evaluate, read_snapshot
from ._merge import merge
from ._model import Diagnostic, FileConfig, InputError, MergedConfig, Mirror, Registry
from ._render import HEADER, CertFiles, Rendered, render
from ._validate import load_file
from ._write import ApplyResult, apply, is_owned
from ._yaml import YamlConfig, load_yaml

__all__ = [
    "HEADER",
    "ApplyResult",
    "CertFiles",
    "Diagnostic",
    "FileConfig",
    "InputError",
    "Inputs",
    "MergedConfig",
    "Mirror",
    "Outcome",
    "Registry",
    "RegistryMirrorsConsumer",
    "Rendered",
    "Settings",
    "Snapshot",
    "YamlConfig",
    "apply",
    "create",
    "evaluate",
    "is_owned",
    "is_valid_host",
    "load_file",
    "load_yaml",
    "merge",
    "read_snapshot",
    "render",
]


def create(ctx: ConsumerContext) -> RegistryMirrorsConsumer:
    """Entry point of ``reloadd.consumers``: validate the options and build the consumer.

    Raises:
        reloadd.ConfigError: an unknown option, a wrong type, or a bad ``notify`` table.
    """
    return RegistryMirrorsConsumer(ctx, Settings.from_context(ctx))
