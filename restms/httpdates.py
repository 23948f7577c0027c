"""ETags and HTTP dates (digest §3, H1-H6).

An ETag is opaque and depends on the resource, its version and the representation
(H6), so the XML, JSON and ``text/xml`` forms of one resource version differ.
Dates are RFC 1123 GMT with one-second resolution (H2); ``UTC`` is accepted too.
"""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime
from email.utils import formatdate, parsedate_to_datetime


def etag(key: str, version: int, fmt_tag: str) -> str:
    digest = hashlib.blake2b(f"{key}\x00{version}".encode(), digest_size=9).hexdigest()
    return f'"{digest}-{fmt_tag}"'


def http_date(timestamp: float) -> str:
    """Seconds since the epoch -> ``Sun, 06 Nov 1994 08:49:37 GMT``."""
    return formatdate(int(timestamp), usegmt=True)


def parse_http_date(value: str | None) -> float | None:
    """An HTTP date -> seconds since the epoch, or None when absent or unreadable."""
    if not value:
        return None
    try:
        parsed = parsedate_to_datetime(value.strip())
    except (TypeError, ValueError, IndexError):
        return None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return parsed.timestamp()


def now_utc() -> datetime:
    return datetime.now(UTC)


def etag_list(header: str | None) -> list[str]:
    """``"a", W/"b"`` -> ``['"a"', '"b"']``; ``*`` stays ``*``. Weak tags compare weakly."""
    if not header:
        return []
    tags = []
    for part in header.split(","):
        tag = part.strip()
        if tag.startswith("W/"):
            tag = tag[2:]
        if tag:
            tags.append(tag)
    return tags
