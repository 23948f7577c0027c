"""The embedded engine's values: a cursor's batch of messages is made without the
dataclass's ``__init__`` (feeds/embedded/values.py says why); it must be exactly what
the general :func:`message` makes, field for field."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from feeds.embedded.values import message, messages
from feeds.engine import Engine
from feeds.model import Blob as HeldBlob
from feeds.model import Message as Held
from feeds.service import Message
from restms.specs import EmbeddedContent, MessageSpec, PipeSpec

ENGINE = Engine()
PIPE = ENGINE.create_pipe(ENGINE.default_feed.domain, PipeSpec(), "alice")

part = st.one_of(
    st.none(),
    st.builds(EmbeddedContent, value=st.text(max_size=8)),
    st.builds(HeldBlob, st.binary(max_size=8), st.sampled_from(["", "text/plain"])),
)
held = st.builds(
    Held,
    seq=st.integers(1, 10**9),
    spec=st.builds(MessageSpec, address=st.text(max_size=8)),
    parts=st.lists(part, max_size=3).map(tuple),
    feed_name=st.one_of(st.none(), st.text(max_size=8)),
    source=st.none(),
    arrived=st.floats(0, 2e9),
    size=st.integers(0, 10**6),
    redeliveries=st.integers(0, 5),
)


@given(st.lists(held, max_size=5))
def test_a_batch_is_what_message_makes_of_each(batch: list[Held]) -> None:
    made = messages(PIPE, batch)
    assert made == [message(PIPE, one) for one in batch]  # reads every field: all set
    for value in made:
        assert type(value) is Message
        with pytest.raises(dataclasses.FrozenInstanceError):
            value.position = 0  # type: ignore[misc]
