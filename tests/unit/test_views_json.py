"""A delivered message's JSON document built directly (views.delivered_json, what an
SSE event carries) is the one the JSON codec makes of its element tree."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

import restms
from feeds.service import Blob, Message, Part
from gateway.restms import views
from restms.specs import MESSAGE_PROPERTIES, EmbeddedContent, MessageSpec
from restms.uris import Base

BASE = Base("https", "gw.example:8443")
text = st.text(max_size=12)
parts: st.SearchStrategy[Part] = st.one_of(
    st.none(),  # a content the reader deleted (D6)
    st.builds(
        EmbeddedContent, type=text, encoding=st.sampled_from(["plain", "base64"]), value=text
    ),
    st.builds(Blob, data=st.binary(max_size=4), content_type=text),
)


@st.composite
def messages(draw: st.DrawFn) -> Message:
    names = draw(st.lists(st.sampled_from(sorted(MESSAGE_PROPERTIES)), unique=True, max_size=3))
    spec = MessageSpec(
        address=draw(text),
        props=tuple((name, draw(text)) for name in names),
        headers=tuple(draw(st.lists(st.tuples(text, text), max_size=3))),
    )
    return Message(
        pipe=draw(st.sampled_from(["p1a2b3", "pipe-x"])),
        position=draw(st.integers(1, 10**12)),
        spec=spec,
        parts=tuple(draw(st.lists(parts, max_size=3))),
        feed=draw(st.sampled_from([None, "news", "a feed/with ünïcode"])),
        arrived=0.0,
        redeliveries=draw(st.integers(0, 3)),
        size=0,
        version=0,
        stamp="s" * 20,
    )


@given(messages(), st.booleans())
def test_the_same_document_as_the_element_tree(message: Message, href: bool) -> None:
    tree = views.delivered_element(BASE, message, href=href)
    assert views.delivered_json(BASE, message, href=href) == restms.to_json(views.doc(tree))


def test_a_plain_message_with_an_id() -> None:
    spec = MessageSpec(address="news.x", props=(("message_id", "m-1"),))
    content = EmbeddedContent(type="text/plain", encoding="plain", value="hello")
    message = Message(
        pipe="p1", position=7, spec=spec, parts=(content,), feed="news", arrived=0.0,
        redeliveries=0, size=5, version=0, stamp="s" * 20,
    )  # fmt: skip
    assert views.delivered_json(BASE, message, href=True) == (
        b'{"restms":{"message":[{"href":"https://gw.example:8443/restms/resource/p1.7",'
        b'"address":"news.x","message_id":"m-1","feed":"https://gw.example:8443/restms/feed/news",'
        b'"content":[{"type":"text/plain","encoding":"plain","value":"hello"}]}]}}'
    )
