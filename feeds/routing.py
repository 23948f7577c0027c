"""How each feed type selects joins for a message (4/AMQP9 §6.2; F5-F8, F21).

Selection is pure: given a feed's joins and a message, say which joins match.
Whether a matched pipe can take the message (full pipes, ondemand demand) and
the round-robin of rotator and service feeds are the engine's business.

* ``""`` and ``direct``: the join address equals the message address (F7: ``*`` is
  literal here). Joins are indexed by address, so the default feed with one join per
  pipe routes in constant time.
* ``fanout``: every join.
* ``topic``: dot-separated words; ``*`` matches one word, ``#`` zero or more (F5).
  ``""`` has zero words. Results are cached per address until the joins change.
* ``headers``: every join header is on the message with an equal value; a join
  without headers matches everything (F6).
* ``regexp`` (our extension, F12): the join address is an RE2 pattern that must match
  the whole message address. RE2 runs in linear time, so a hostile pattern cannot
  stall the server.
* ``rotator``/``service``: no filtering; the engine picks one join.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import re2

from restms.errors import BadRequest

Matcher = Callable[[str, Mapping[str, str]], bool]

_RE2_OPTIONS = re2.Options()
_RE2_OPTIONS.log_errors = False
_RE2_OPTIONS.max_mem = 1 << 20  # per pattern; large enough for any sane address filter
MAX_PATTERN = 1024


def words(address: str) -> tuple[str, ...]:
    return tuple(address.split(".")) if address else ()


def topic_match(pattern: tuple[str, ...], address: tuple[str, ...]) -> bool:
    """AMQP topic matching over words, with backtracking on the last ``#`` seen."""
    pi = wi = 0
    hash_at = -1
    resume = 0
    while wi < len(address):
        if pi < len(pattern) and pattern[pi] == "#":
            hash_at, resume = pi, wi
            pi += 1
        elif pi < len(pattern) and (pattern[pi] == "*" or pattern[pi] == address[wi]):
            pi += 1
            wi += 1
        elif hash_at >= 0:
            resume += 1
            pi, wi = hash_at + 1, resume
        else:
            return False
    while pi < len(pattern) and pattern[pi] == "#":
        pi += 1
    return pi == len(pattern)


def headers_match(wanted: tuple[tuple[str, str], ...], have: Mapping[str, str]) -> bool:
    return all(have.get(name) == value for name, value in wanted)


def matcher(feed_type: str, address: str, headers: tuple[tuple[str, str], ...]) -> Matcher | None:
    """A predicate for one join on a feed of this type; None where every message matches.

    Raises 400 for a join address the feed type cannot use (a bad regexp).
    """
    if feed_type == "topic":
        pattern = words(address)
        return lambda addr, _h: topic_match(pattern, words(addr))
    if feed_type == "headers":
        if not headers:
            return None
        return lambda _a, have: headers_match(headers, have)
    if feed_type == "regexp":
        if len(address) > MAX_PATTERN:
            raise BadRequest(f"regexp join address longer than {MAX_PATTERN} characters")
        try:
            compiled = re2.compile(address, _RE2_OPTIONS)
        except re2.error as exc:
            # RE2's reason comes as bytes: shown as text, never as a Python repr.
            why = exc.args[0] if exc.args else ""
            if isinstance(why, bytes):
                why = why.decode("utf-8", "replace")
            raise BadRequest(f"join address is not a valid RE2 pattern: {why}") from exc
        return lambda addr, _h: compiled.fullmatch(addr) is not None
    if feed_type in ("", "direct"):
        return lambda addr, _h: addr == address
    return None  # fanout, rotator, service


INDEXED_TYPES = frozenset({"", "direct"})  # routed through an address index
QUEUEING_TYPES = frozenset({"rotator", "service"})
