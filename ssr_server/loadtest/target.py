"""Where a load may go: loopback only, unless the caller says otherwise."""

from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit


class RemoteTargetError(ValueError):
    """The target is not a loopback address and ``allow_remote`` was not given."""


def is_loopback(target: str) -> bool:
    """True for http(s) URLs on 127.0.0.0/8, ::1 or ``localhost`` (names are not resolved)."""
    try:
        parts = urlsplit(target)
        host = parts.hostname
    except ValueError:
        return False
    if parts.scheme not in ("http", "https") or not host:
        return False
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_target(target: str, allow_remote: bool = False) -> str:
    """The target without a trailing slash; refuses non-loopback hosts unless ``allow_remote``."""
    parts = urlsplit(target)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"target must be an http(s) URL, got {target!r}")
    if not allow_remote and not is_loopback(target):
        raise RemoteTargetError(
            f"refusing to load {parts.hostname!r}: only loopback targets (127.0.0.0/8, ::1, localhost) "
            "unless allow_remote=True")
    return target.rstrip("/")
