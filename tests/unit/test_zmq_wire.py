"""Gateway message <-> ZeroMQ frames, wire format version 1 (bridges/zmq_wire.py).

Frames here are plain ``bytes`` (and a few ``memoryview``/``bytearray``), as a zmq
socket hands them over with ``copy=True`` or as buffers; no socket is involved.
"""

from __future__ import annotations

import base64

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bridges.amqp_map import Unmappable
from bridges.zmq_wire import (
    OCTET,
    VERSION,
    Malformed,
    decode,
    encode,
    error_frames,
    error_of,
)
from feeds.service import Blob, Part
from restms.document import NOT_XML
from restms.names import MAX_ADDRESS
from restms.specs import (
    MESSAGE_PROPERTIES,
    EmbeddedContent,
    MessageLimits,
    MessageSpec,
    build_message,
)
from tests.examples import examples

SETTINGS = settings(max_examples=examples(200), deadline=None)
LIMITS = MessageLimits()
MAX = 1 << 20


def spec(
    attrs: dict[str, str] | None = None, headers: list[tuple[str, str]] | None = None
) -> MessageSpec:
    return build_message(attrs or {}, headers or [], [], LIMITS)


def env(**keys: object) -> bytes:
    """An envelope frame: version 1 and these keys."""
    return orjson.dumps({"v": VERSION, **keys})


def only_content(message: MessageSpec) -> EmbeddedContent:
    (content,) = message.contents
    assert isinstance(content, EmbeddedContent)
    return content


def data_of(part: Part) -> tuple[bytes, str]:
    if isinstance(part, Blob):
        return part.data, part.content_type
    return part.data(), part.type


def plain(value: str, type: str = "text/plain") -> EmbeddedContent:
    return EmbeddedContent(type=type, encoding="plain", value=value)


# ---------------------------------------------------------------- round trips
@pytest.mark.parametrize(
    ("message", "parts", "encoding"),
    [
        pytest.param(spec(), [], None, id="bare"),
        pytest.param(spec({"address": "orders.eu"}), [], None, id="address-only"),
        pytest.param(
            spec(
                {
                    "address": "a/b c",
                    "message_id": "m-1",
                    "reply_to": "/pipe/x",
                    "correlation_id": "c-9",
                    "delivery_mode": "2",
                    "priority": "7",
                    "expiration": "60000",
                    "timestamp": "1700000000",
                    "type": "order",
                    "user_id": "zoë",
                    "app_id": "app",
                    "sender_id": "s",
                }
            ),
            [],
            None,
            id="every-property",
        ),
        pytest.param(
            spec({}, [("b", "2"), ("a", "1"), ("b", "3"), ("empty", "")]),
            [],
            None,
            id="headers-order-repeats-empty-value",
        ),
        pytest.param(spec(), [plain("héllo\n\tworld\r\n")], "plain", id="plain-text"),
        pytest.param(
            spec(), [Blob(data=b"\x00\x01\xff", content_type=OCTET)], "base64", id="binary-blob"
        ),
        pytest.param(
            spec(), [Blob(data=b"\xef\xbf\xbe", content_type="text/plain")], "base64", id="u+fffe"
        ),
        pytest.param(
            spec(), [Blob(data=b"x\x0by", content_type="text/plain")], "base64", id="vertical-tab"
        ),
        pytest.param(
            spec(),
            [Blob(data=b"\xef\xbf\xbd\x7f", content_type="text/x")],
            "plain",
            id="u+fffd-del",
        ),
        pytest.param(
            spec(),
            [EmbeddedContent(type="text/csv", encoding="base64", value="YSxi")],
            "plain",
            id="base64-text-becomes-plain",
        ),
        pytest.param(
            spec(), [Blob(data=b"", content_type="application/json")], "plain", id="empty-with-type"
        ),
        pytest.param(spec(), [plain("", "")], "plain", id="empty-type"),
        pytest.param(spec(), [None, plain("kept"), None], "plain", id="deleted-parts-skipped"),
        pytest.param(spec(), [None], None, id="all-parts-deleted"),
        pytest.param(
            spec({"address": "k", "message_id": "1"}, [("h", "v")]),
            [Blob(data=bytes(range(256)), content_type="image/png")],
            "base64",
            id="everything",
        ),
    ],
)
def test_roundtrip(message: MessageSpec, parts: list[Part | None], encoding: str | None) -> None:
    frames = encode(message, parts)
    assert len(frames) == 3
    assert frames[0] == message.address.encode()
    back = decode(frames, max_size=MAX)
    assert (back.address, back.props, back.headers) == (
        message.address,
        message.props,
        message.headers,
    )
    present = [part for part in parts if part is not None]
    if encoding is None:
        assert back.contents == ()
    else:
        content = only_content(back)
        assert content.encoding == encoding
        assert (content.data(), content.type) == data_of(present[0])


@pytest.mark.parametrize(
    ("message", "parts", "envelope"),
    [
        pytest.param(spec(), [], {"v": 1}, id="bare"),
        pytest.param(spec({"priority": "1"}), [], {"v": 1, "p": {"priority": "1"}}, id="props"),
        pytest.param(spec({}, [("a", "1")]), [], {"v": 1, "h": [["a", "1"]]}, id="headers"),
        pytest.param(
            spec(), [Blob(data=b"", content_type=OCTET)], {"v": 1, "t": OCTET}, id="typed-body"
        ),
    ],
)
def test_envelope_is_compact(
    message: MessageSpec, parts: list[Part | None], envelope: dict[str, object]
) -> None:
    assert encode(message, parts)[1] == orjson.dumps(envelope)


def test_encode_multiple_contents_is_unmappable() -> None:
    with pytest.raises(Unmappable, match="2 contents"):
        encode(spec(), [plain("a"), None, Blob(data=b"b", content_type=OCTET)])


def test_encode_text_that_is_not_unicode_is_unmappable() -> None:
    with pytest.raises(Unmappable, match="cannot write"):
        encode(MessageSpec(address="\ud800"), [])
    with pytest.raises(Unmappable, match="cannot write"):
        encode(MessageSpec(headers=(("h", "\udfff"),)), [])


# ---------------------------------------------------------------- inbound shapes
@pytest.mark.parametrize(
    ("frames", "address", "content"),
    [
        pytest.param([b"raw"], "dflt", (b"raw", "plain"), id="one-frame"),
        pytest.param([b""], "dflt", (b"", "plain"), id="one-empty-frame-is-a-content"),
        pytest.param([b"\xff\x00"], "dflt", (b"\xff\x00", "base64"), id="one-binary-frame"),
        pytest.param([b"topic", b"raw"], "topic", (b"raw", "plain"), id="two-frames"),
        pytest.param([b"", b""], "", (b"", "plain"), id="two-empty-frames"),
        pytest.param([b"t", env(), b""], "t", None, id="empty-body-no-type-no-content"),
        pytest.param([b"t", env(), b"\x01"], "t", (b"\x01", "base64"), id="body-no-type-octet"),
    ],
)
def test_inbound_shapes(
    frames: list[bytes], address: str, content: tuple[bytes, str] | None
) -> None:
    message = decode(frames, default_address="dflt", max_size=MAX)
    assert message.address == address
    assert message.props == message.headers == ()
    if content is None:
        assert message.contents == ()
    else:
        got = only_content(message)
        assert (got.data(), got.encoding, got.type) == (*content, OCTET)


def test_buffers_are_taken_like_bytes() -> None:
    frames = encode(spec({"address": "a", "message_id": "m"}, [("h", "v")]), [plain("body")])
    views: list[bytes | bytearray | memoryview] = [
        memoryview(frames[0]),
        bytearray(frames[1]),
        memoryview(frames[2]),
    ]
    assert decode(views, max_size=MAX) == decode(frames, max_size=MAX)


def test_headers_as_an_object() -> None:
    message = decode([b"", env(h={"a": "1", "b": "2"}), b""], max_size=MAX)
    assert message.headers == (("a", "1"), ("b", "2"))


def test_unknown_keys_and_properties_are_ignored() -> None:
    envelope = env(
        p={"message_id": "m", "address": "not-this", "x-later": 7, "priority": ""},
        z={"later": ["x"]},
        e="an error text is no concern of decode",
    )
    message = decode([b"right", envelope, b""], max_size=MAX)
    assert message.address == "right"
    assert message.props == (("message_id", "m"),)  # an empty value is no property


def test_body_at_the_limit_is_taken() -> None:
    assert only_content(decode([b"x" * 8], max_size=8)).data() == b"x" * 8


def test_default_address_must_be_an_address() -> None:
    with pytest.raises(Malformed, match="longer than"):
        decode([b""], default_address="a" * (MAX_ADDRESS + 1), max_size=MAX)
    with pytest.raises(Malformed, match=r"XML 1\.0 cannot carry"):
        decode([b""], default_address="a\x00", max_size=MAX)


# ---------------------------------------------------------------- malformed
@pytest.mark.parametrize(
    ("frames", "reason"),
    [
        pytest.param([], "0 frames", id="no-frames"),
        pytest.param([b"a", env(), b"", b""], "4 frames", id="four-frames"),
        pytest.param([b"\xff", env(), b""], "address frame is not UTF-8", id="address-utf8"),
        pytest.param([b"\xc3", b""], "address frame is not UTF-8", id="two-frame-address-utf8"),
        pytest.param([b"a" * (MAX_ADDRESS + 1), env(), b""], "address longer", id="long-address"),
        pytest.param([b"a\x01b", env(), b""], "address holds a character", id="address-control"),
        pytest.param([b"", b"[1]", b""], "JSON list, not an object", id="envelope-list"),
        pytest.param([b"", b'"v"', b""], "JSON str, not an object", id="envelope-string"),
        pytest.param([b"", b"{v:1}", b""], "not JSON", id="bad-json"),
        pytest.param([b"", b"", b""], "not JSON", id="empty-envelope"),
        pytest.param([b"", b'{"v":1,"t":"\xff"}', b""], "not JSON", id="envelope-utf8"),
        pytest.param([b"", b"{}", b""], "no version", id="no-version"),
        pytest.param([b"", b'{"v":null}', b""], "no version", id="null-version"),
        pytest.param([b"", b'{"v":2}', b""], "version 2 is not supported", id="version-2"),
        pytest.param([b"", b'{"v":"1"}', b""], "version '1' is not supported", id="text-1"),
        pytest.param([b"", b'{"v":1.0}', b""], "version 1.0 is not supported", id="float-1"),
        pytest.param([b"", b'{"v":true}', b""], "version True is not supported", id="true"),
        pytest.param([b"", env(p=["message_id"]), b""], "p must be an object", id="p-list"),
        pytest.param(
            [b"", env(p={"message_id": 1}), b""], "message_id must be a string", id="p-number"
        ),
        pytest.param(
            [b"", env(p={"reply_to": None}), b""], "reply_to must be a string", id="p-null"
        ),
        pytest.param([b"", env(h="a=1"), b""], "h must be a list", id="h-string"),
        pytest.param([b"", env(h=3), b""], "h must be a list", id="h-number"),
        pytest.param([b"", env(h=["a", "1"]), b""], "not a [name, value] pair", id="h-flat"),
        pytest.param([b"", env(h=[["a"]]), b""], "not a [name, value] pair", id="h-short"),
        pytest.param([b"", env(h=[["a", "1", "2"]]), b""], "not a [name, value]", id="h-long"),
        pytest.param([b"", env(h=[{"a": "1"}]), b""], "not a [name, value]", id="h-object"),
        pytest.param([b"", env(h=[["a", 1]]), b""], "pair of strings", id="h-number-value"),
        pytest.param([b"", env(h=[[None, "1"]]), b""], "pair of strings", id="h-null-name"),
        pytest.param([b"", env(h={"a": 1}), b""], "pair of strings", id="h-object-number"),
        pytest.param([b"", env(h=[["", "1"]]), b""], "needs a name", id="h-empty-name"),
        pytest.param([b"", env(h=[["a\u0000", "1"]]), b""], "XML 1.0", id="h-name-control"),
        pytest.param([b"", env(h=[["a", "\ufffe"]]), b""], "XML 1.0", id="h-value-fffe"),
        pytest.param([b"", env(p={"type": "\u001b"}), b""], "type holds", id="p-control"),
        pytest.param([b"", env(t=1), b"x"], "t must be a content type", id="t-number"),
        pytest.param([b"", env(t="a\u0007"), b"x"], "content type holds", id="t-control"),
        pytest.param(
            [b"", env(), b"x" * 11], "body of 11 bytes is over the limit of 10 bytes", id="big"
        ),
        pytest.param([b"x" * 11], "body of 11 bytes is over the limit of 10", id="big-1-frame"),
        pytest.param([b"", b"x" * 11], "body of 11 bytes", id="big-2-frames"),
        pytest.param([b"", env(p={"priority": "10"}), b""], "priority must be 0 to 9", id="prio"),
        pytest.param(
            [b"", env(p={"delivery_mode": "3"}), b""], "delivery_mode must be 1 to 2", id="mode"
        ),
        pytest.param(
            [b"", env(p={"expiration": "-1"}), b""], "expiration (milliseconds)", id="ttl"
        ),
    ],
)
def test_malformed(frames: list[bytes], reason: str) -> None:
    with pytest.raises(Malformed) as caught:
        decode(frames, max_size=10)
    assert reason in str(caught.value)


def test_over_the_header_limit_is_malformed() -> None:
    frames = [b"", env(h=[["a", "1"], ["b", "2"]]), b""]
    with pytest.raises(Malformed, match="more than 1 headers"):
        decode(frames, max_size=MAX, limits=MessageLimits(max_headers=1))
    assert len(decode(frames, max_size=MAX, limits=MessageLimits(max_headers=2)).headers) == 2


def test_malformed_is_a_value_error_with_its_cause() -> None:
    with pytest.raises(Malformed) as caught:
        decode([b"", env(p={"priority": "x"}), b""], max_size=MAX)
    assert isinstance(caught.value, ValueError)
    assert caught.value.__cause__ is not None


# ---------------------------------------------------------------- error replies
@pytest.mark.parametrize(
    ("address", "correlation_id", "error"),
    [
        pytest.param("replies", "c-1", "no such feed", id="with-correlation"),
        pytest.param("", "", "body of 11 bytes is over the limit", id="bare"),
        pytest.param("ä", "ü", 'ö "quoted" \n', id="unicode"),
    ],
)
def test_error_frames_roundtrip(address: str, correlation_id: str, error: str) -> None:
    frames = error_frames(address, correlation_id, error)
    assert frames[0] == address.encode()
    assert frames[2] == b""
    assert error_of(frames) == error
    reply = decode(frames, max_size=MAX)
    assert reply.address == address
    assert reply.prop("correlation_id") == (correlation_id or None)
    assert reply.contents == ()
    assert ("p" in orjson.loads(frames[1])) == bool(correlation_id)


def test_error_frames_never_raise() -> None:
    frames = error_frames("\ud800", "\udc00", "bad \ud800 text")
    assert error_of(frames) == "bad ? text"


@pytest.mark.parametrize(
    "frames",
    [
        pytest.param([b"", env(e="x")], id="two-frames"),
        pytest.param([b"", env(e="x"), b"", b""], id="four-frames"),
        pytest.param([b"", env(), b""], id="no-error"),
        pytest.param([b"", env(e=["x"]), b""], id="error-not-text"),
        pytest.param([b"", b"{nope", b""], id="bad-json"),
        pytest.param([b"", b"[]", b""], id="not-an-object"),
        pytest.param([b"", b"\xff", b""], id="bad-utf8"),
    ],
)
def test_error_of_is_empty_otherwise(frames: list[bytes]) -> None:
    assert error_of(frames) == ""


def test_error_of_gateway_message_without_error() -> None:
    assert error_of(encode(spec({"address": "a"}), [plain("x")])) == ""


# ---------------------------------------------------------------- Hypothesis
XML_TEXT = st.text(st.characters(codec="utf-8")).filter(lambda text: not NOT_XML.search(text))
NONEMPTY = XML_TEXT.filter(bool)
CONTENT_TYPES = st.sampled_from([OCTET, "text/plain", "application/json", "image/png", ""])
VALUES = {
    "delivery_mode": st.sampled_from("12"),
    "priority": st.sampled_from("0123456789"),
    "expiration": st.integers(0, 2**32 - 1).map(str),
}


@st.composite
def gateway_messages(draw: st.DrawFn) -> tuple[MessageSpec, list[Part | None]]:
    attrs = {"address": draw(XML_TEXT.filter(lambda a: len(a) <= MAX_ADDRESS))}
    for name in draw(st.sets(st.sampled_from(MESSAGE_PROPERTIES))):
        attrs[name] = draw(VALUES.get(name, NONEMPTY))
    headers = draw(st.lists(st.tuples(NONEMPTY, XML_TEXT), max_size=6))
    parts: list[Part | None] = draw(st.lists(st.none(), max_size=2))
    if draw(st.booleans()):
        data = draw(st.binary(max_size=512) | XML_TEXT.map(str.encode))
        content_type = draw(CONTENT_TYPES)
        value = base64.b64encode(data).decode()
        part: Part = (
            Blob(data=data, content_type=content_type)
            if draw(st.booleans())
            else EmbeddedContent(type=content_type, encoding="base64", value=value)
        )
        parts.insert(draw(st.integers(0, len(parts))), part)
    return spec(attrs, headers), parts


@SETTINGS
@given(gateway_messages())
def test_hypothesis_roundtrip(case: tuple[MessageSpec, list[Part | None]]) -> None:
    original, parts = case
    back = decode(encode(original, parts), max_size=MAX)
    assert (back.address, back.props, back.headers) == (
        original.address,
        original.props,
        original.headers,
    )
    present = [part for part in parts if part is not None]
    if not present:
        assert back.contents == ()
        return
    content = only_content(back)
    data, content_type = data_of(present[0])
    assert (content.data(), content.type) == (data, content_type)
    assert content.encoding == ("base64" if _needs_base64(data) else "plain")


def _needs_base64(data: bytes) -> bool:
    """The M6 rule, as amqp_map states it: not UTF-8, or text XML cannot carry."""
    try:
        return bool(NOT_XML.search(data.decode()))
    except UnicodeDecodeError:
        return True
