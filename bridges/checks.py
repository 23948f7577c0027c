"""What every kind of bridge definition checks the same way: its name, its delays, and
URLs shown without their passwords."""

from __future__ import annotations

import re

NAME = re.compile(r"[A-Za-z0-9._-]{1,64}")
MAX_DELAY = 3600.0  # seconds: the longest delay, timeout or heartbeat a bridge may have


def redact(url: str) -> str:
    """The URL without its password (for logs, status and errors), even when the URL
    is malformed."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    authority, slash, path = rest.partition("/")
    userinfo, at, host = authority.rpartition("@")
    if not at or ":" not in userinfo:
        return url
    user = userinfo.split(":", 1)[0]
    return f"{scheme}://{user}:***@{host}{slash}{path}"
