"""The traffic event schema and the lake's file layout (docs/ANALYTICS.md, "Event schema").

This module is the contract between the mirror that writes the lake
(:mod:`spark_sink.mirror`, :mod:`spark_sink.writer`) and the Spark jobs that read it.
It holds no state and imports nothing of the gateway.

An event is one row. The engine hands the mirror a plain tuple in :data:`COLUMNS`
order (``ts`` as wall-clock seconds since the epoch, a float), or for an accepted
publish one :data:`Request` record that carries all its rows (one :data:`Routed`
record when it is one message routed to one pipe): building a tuple (or a few lists
a request) is the cheapest thing the hot path can do, and the writer turns batches of
them into Arrow record batches off the event loop's thread.

Files live at ``<lake>/date=YYYY-MM-DD/hour=HH/part-<utc-start>-<node>-<random>.parquet``:
Hive-style partition directories derived from ``ts`` in UTC, whose values (``date``
a string, ``hour`` an int) are not stored inside the files. A file is written under
a name starting with ``.tmp-`` in its partition directory and renamed when complete;
Spark and pyarrow skip names that start with a dot or an underscore.
"""

from __future__ import annotations

import datetime
import os
import re
import secrets
import socket
from typing import Final

# What happened to a message; one row per event.
PUBLISH: Final = "publish"  # a message accepted by a feed (outcome "ok" or "duplicate")
ROUTE: Final = "route"  # a copy placed in one matching pipe
DELIVER: Final = "deliver"  # a copy handed to a reader (GET, SSE, WebSocket, stream, webhook)
ACK: Final = "ack"  # a copy acknowledged (deleted) by its reader
REDELIVER: Final = "redeliver"  # a lease ran out: the copy is delivered again
EXPIRE: Final = "expire"  # a copy whose expiration passed, unread
DEAD_LETTER: Final = "dead_letter"  # a copy moved to a dead-letter feed (outcome: why)
DROP: Final = "drop"  # a copy not kept: full pipe skipped, oldest dropped, publish refused
BRIDGE_IN: Final = "bridge_in"  # a message a bridge published from the far side
BRIDGE_OUT: Final = "bridge_out"  # a message a bridge passed on to the far side
WEBHOOK_ATTEMPT: Final = "webhook_attempt"  # one POST to a webhook receiver (outcome: status)
MIRROR_LOST: Final = "mirror_lost"  # events the mirror could not keep (size: how many)

EVENTS: Final = (
    PUBLISH,
    ROUTE,
    DELIVER,
    ACK,
    REDELIVER,
    EXPIRE,
    DEAD_LETTER,
    DROP,
    BRIDGE_IN,
    BRIDGE_OUT,
    WEBHOOK_ATTEMPT,
    MIRROR_LOST,
)

OK: Final = "ok"
FULL: Final = "full"  # the outcome of a drop: the pipe was full and skipped the copy
DROPPED: Final = "dropped"  # the outcome of mirror_lost: the mirror's queue was full

# The columns of an event, in order; their Arrow types are :data:`spark_sink.lake.SCHEMA`
# (pyarrow is loaded only where files are written or read, not in the gateway).
COLUMNS: Final = (
    "ts",
    "event",
    "domain",
    "feed",
    "feed_type",
    "address",
    "pipe",
    "message_id",
    "size",
    "principal",
    "outcome",
    "latency_ms",
    "bridge",
)
TS: Final = 0  # the position of ts in an event tuple

Event = tuple[
    float,  # ts: seconds since the epoch, wall clock
    str,  # event
    str,  # domain
    str,  # feed
    str,  # feed_type
    str | None,  # address
    str | None,  # pipe (a digest, never the name)
    str | None,  # message_id
    int,  # size
    str | None,  # principal
    str,  # outcome
    float | None,  # latency_ms
    str | None,  # bridge
]


# One publish request's events as one record (docs/ANALYTICS.md, "The mirror"): the
# engine hands the mirror this instead of a tuple per event when a publish is
# accepted, so the event loop builds a few lists per request, not two tuples per
# message; the writer process expands it into exactly the rows the events would
# have been. A column given as a list has one value per message; anything else is
# the value of every message (or, for ``pipes``, of every route).
REQUEST: Final = "+request"  # at index 1, where an event tuple has its event name
Request = tuple[
    float,  # ts: seconds since the epoch, wall clock (every row's)
    str,  # REQUEST
    int,  # rows: messages plus routes
    str,  # domain
    str,  # feed
    str,  # feed_type
    str | None,  # principal (of the publish rows; route rows have none)
    int,  # n: messages
    list[str | None] | str | None,  # address of each message
    list[str | None] | None,  # message_id of each message
    list[int],  # size of each message (its embedded contents)
    list[str] | str,  # outcome of each publish row ("ok" or "duplicate")
    list[str] | str | None,  # pipe of each route row (a digest)
    list[int] | None,  # route rows (copies) of each message; None: one each
    list[int] | None,  # size of each message's routed copies; None: as ``size``
    list[tuple[int, str, int]] | None,  # drop rows: (message, pipe, size) a full pipe skipped
]
ROWS: Final = 2  # the position of rows in a request record

# The commonest publish, one message whose one copy went to one pipe, as one record of
# the two events it makes, in their order: its "route" event, then its "publish" event
# (docs/ANALYTICS.md, "The mirror"). The event loop builds one short tuple instead of
# two events (and less than a request record); it counts as two rows everywhere rows
# are counted. Its first nine values are the route event's, in COLUMNS order; the
# publish event has the same but for the pipe (none), the principal and the size.
ROUTED: Final = "+route+publish"  # at index 1, where an event tuple has its event name
ROUTED_ROWS: Final = 2
Routed = tuple[
    float,  # ts: seconds since the epoch, wall clock (both rows')
    str,  # ROUTED
    str,  # domain
    str,  # feed
    str,  # feed_type
    str | None,  # address
    str,  # pipe of the route row (a digest)
    str | None,  # message_id
    int,  # size of the route row (the copy, staged contents it links included)
    str | None,  # principal of the publish row (the route row has none)
    int,  # size of the publish row (the message's embedded contents)
]


def routed_events(record: Routed) -> tuple[Event, Event]:
    """The two events a :data:`Routed` record stands for: its route, then its publish."""
    ts, _, domain, feed, feed_type, address, pipe, message_id, size, principal, published = record
    return (
        (ts, ROUTE, domain, feed, feed_type, address, pipe, message_id, size, None, OK, None, None),
        (
            ts,
            PUBLISH,
            domain,
            feed,
            feed_type,
            address,
            None,
            message_id,
            published,
            principal,
            OK,
            None,
            None,
        ),
    )


def lost_event(ts: float, count: int) -> Event:
    """The row that says the mirror dropped ``count`` events (queue and spill full) just
    before ``ts``: of no feed, its ``size`` the number of events."""
    return (ts, MIRROR_LOST, "", "", "", None, None, None, count, None, DROPPED, None, None)


def partition(ts: float) -> str:
    """The partition directory (relative to the lake) of an event at ``ts``."""
    when = datetime.datetime.fromtimestamp(ts, datetime.UTC)
    return f"date={when:%Y-%m-%d}/hour={when:%H}"


def node_id(host: str, pid: int) -> str:
    """Who writes a data file: the host name (letters, digits and ``-`` only, at most 40
    characters, so that a name is safe on every file system and in every URI scheme) and
    the id of the writing process. Nodes sharing one lake (docs/CLUSTER.md) each write
    files of their own, and a file tells which machine and process wrote it."""
    safe = re.sub(r"[^A-Za-z0-9]+", "-", host).strip("-")[:40].strip("-") or "host"
    return f"{safe}-{pid}"


def part_name(start: float, node: str | None = None) -> str:
    """A data file's name: when it was started (UTC, to the second), the node that
    writes it (:func:`node_id`; by default this host and process, asked at each call
    since the writer is a process forked for the purpose) and a random tail, so that two
    writers (two nodes, two runs, two hosts of one name) never choose the same name."""
    when = datetime.datetime.fromtimestamp(start, datetime.UTC)
    if node is None:
        node = node_id(socket.gethostname(), os.getpid())
    return f"part-{when:%Y%m%dT%H%M%SZ}-{node}-{secrets.token_hex(6)}.parquet"


def temporary(name: str) -> str:
    """The hidden name a data file has while it is written."""
    return f".tmp-{name}"
