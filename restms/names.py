"""Resource names and private hashes (U2, U6, U7).

Private hashes are 144 random bits in URL-safe base64, never starting with "-": opaque,
unguessable, never reused. Public names and addresses are case-sensitive UTF-8 strings
(Q31); names may not contain ``/``, white space or ``@`` (U7).
"""

from __future__ import annotations

import re
import secrets

from .errors import BadRequest

MAX_NAME = 200
MAX_ADDRESS = 1024
_BAD_NAME = re.compile(r"[/@\s\x00-\x1f\x7f]")


def new_hash() -> str:
    """A fresh private resource hash: 24 URL-safe characters, 144 random bits less the
    0.02 bit it costs that none starts with "-" (a command line such as ``main.py pipes
    inspect NAME`` would read one as an option), which one draw in 64 does: drawn again."""
    while True:
        name = secrets.token_urlsafe(18)
        if name[0] != "-":
            return name


def check_name(name: str, what: str) -> str:
    """Return ``name`` if it may name a public resource, else raise 400."""
    if len(name) > MAX_NAME:
        raise BadRequest(f"{what} name longer than {MAX_NAME} characters")
    if name in (".", ".."):
        raise BadRequest(f"{what} name {name!r} is reserved")
    if _BAD_NAME.search(name):
        raise BadRequest(f"{what} name {name!r} may not contain '/', '@', spaces or controls")
    return name


def check_address(address: str, what: str = "address") -> str:
    if len(address) > MAX_ADDRESS:
        raise BadRequest(f"{what} longer than {MAX_ADDRESS} characters")
    return address
