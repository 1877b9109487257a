"""reloadd: keep a Kubernetes node in step with files on its disk, the moment they change."""

from ._consumer import BaseConsumer, Consumer, ConsumerContext, ConsumerFactory
from ._errors import (
    ConfigError,
    ConsumerError,
    PermanentError,
    PluginError,
    ReloaddError,
    StateError,
    TransientError,
    WatchError,
    WatchLimitError,
)
from ._options import Options, parse_duration
from ._types import (
    Ack,
    Batch,
    Change,
    ChangeKind,
    Fingerprint,
    JSONValue,
    PathRecord,
    Reason,
    Reject,
    Result,
    Retry,
)

__version__ = "0.1.0"

__all__ = [
    "Ack",
    "BaseConsumer",
    "Batch",
    "Change",
    "ChangeKind",
    "ConfigError",
    "Consumer",
    "ConsumerContext",
    "ConsumerError",
    "ConsumerFactory",
    "Fingerprint",
    "JSONValue",
    "Options",
    "PathRecord",
    "PermanentError",
    "PluginError",
    "Reason",
    "Reject",
    "ReloaddError",
    "Result",
    "Retry",
    "StateError",
    "TransientError",
    "WatchError",
    "WatchLimitError",
    "parse_duration",
]
