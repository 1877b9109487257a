"""Just enough of the distribution reference grammar to validate short-name aliases.

The patterns are those of ``docker/reference/regexp.go`` (as vendored by
containers/image); error strings are its ``ErrNameEmpty``/``ErrNameContainsUppercase``/
``ErrReferenceInvalidFormat``/``ErrNameTooLong``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["DOMAIN", "ParsedReference", "ReferenceError", "parse_reference"]

_LABEL = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
DOMAIN = rf"{_LABEL}(?:\.{_LABEL})*(?::[0-9]+)?"
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|[-]*)[a-z0-9]+)*"
_TAG = r"[\w][\w.-]{0,127}"
_DIGEST = r"[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*[:][0-9a-fA-F]{32,}"
_REFERENCE = re.compile(
    rf"(?:(?P<domain>{DOMAIN})/)?(?P<path>{_COMPONENT}(?:/{_COMPONENT})*)"
    rf"(?::(?P<tag>{_TAG}))?(?:@(?P<digest>{_DIGEST}))?",
    re.ASCII,
)
_NAME_TOTAL_LENGTH_MAX = 255


class ReferenceError(ValueError):
    """The string is not a valid image reference."""


@dataclass(frozen=True, slots=True)
class ParsedReference:
    """A reference split into its parts (``domain`` is ``""`` when none was written)."""

    domain: str
    path: str
    tag: str
    digest: str


def parse_reference(s: str) -> ParsedReference:
    """Parse like ``reference.Parse`` (no normalization: ``busybox`` has no domain).

    Raises:
        ReferenceError: with the reference library's message.
    """
    m = _REFERENCE.fullmatch(s)
    if m is None:
        if s == "":
            raise ReferenceError("repository name must have at least one component")
        if _REFERENCE.fullmatch(s.lower()) is not None:
            raise ReferenceError("repository name must be lowercase")
        raise ReferenceError("invalid reference format")
    domain = m.group("domain") or ""
    name = f"{domain}/{m.group('path')}" if domain else m.group("path")
    if len(name) > _NAME_TOTAL_LENGTH_MAX:
        raise ReferenceError(f"repository name must not be more than {_NAME_TOTAL_LENGTH_MAX} characters")
    return ParsedReference(domain, m.group("path"), m.group("tag") or "", m.group("digest") or "")
