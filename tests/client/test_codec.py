"""The client's codec without a gateway: values to documents and back, both formats."""

from __future__ import annotations

from hypothesis import example, given, settings
from hypothesis import strategies as st

from restms_client import Content, Message, codec
from tests.examples import examples

every_character = st.characters(codec=None, categories=None)
# and the ones XML treats specially, often enough to meet them
with_line_ends = st.sampled_from("\r\n\t <&>\"'") | every_character


@settings(max_examples=examples(500))
@example(body=b"a\r\nb\r", address="", header="h", value="\r", media_type=codec.XML)
@given(
    body=st.binary()
    | st.text(with_line_ends).map(lambda t: t.encode("utf-8", "surrogatepass"))
    | st.text(st.sampled_from("\r\n\t ab<&>\"'é")).map(str.encode),  # plain, XML-special
    address=st.text(st.characters(categories=["L", "N", "P"]), max_size=20),
    header=st.text(st.characters(categories=["L", "N"]), min_size=1, max_size=10),
    value=st.text(st.sampled_from('\r\n\t ab<&"'), max_size=10),
    media_type=st.sampled_from([codec.JSON, codec.XML]),
)
def test_a_published_message_reads_back_the_same(
    body: bytes, address: str, header: str, value: str, media_type: str
) -> None:
    sent = Message(
        address=address,
        contents=(Content(type="application/x-test", body=body),),
        headers={header: value},
        priority=4,
        persistent=True,
        correlation_id="c-1",
    )
    document = codec.encode(codec.publish_tree([sent], ["id-1"], None), media_type)
    received, count, href = codec.read_message(codec.decode(document, media_type))
    assert received.contents == sent.contents
    assert (received.address, received.headers) == (sent.address, sent.headers)
    assert (received.priority, received.persistent, received.correlation_id) == (4, True, "c-1")
    assert (received.message_id, count, href) == ("id-1", 0, None)
