"""Gateway message <-> AMQP 1.0 message (bridges/amqp_map.py, docs/AMQP.md).

Every AMQP message under test crosses the wire first: encoded by proton and decoded
into a fresh ``proton.Message``, as a receiver would get it.
"""

from __future__ import annotations

import base64
import uuid
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from proton import Array, Data, Described, Message, char, symbol, timestamp, ubyte, ulong

from bridges.amqp_map import (
    MAX_CREATION_SECONDS,
    Unmappable,
    check_address_from,
    check_target,
    from_amqp,
    render_target,
    to_amqp,
)
from feeds.service import Blob, Part
from restms.document import NOT_XML
from restms.errors import RestMSError
from restms.specs import EmbeddedContent, MessageLimits, MessageSpec, build_message
from tests.examples import examples

SETTINGS = settings(max_examples=examples(200), deadline=None)
LIMITS = MessageLimits()
TEXT = EmbeddedContent(type="text/plain", value="hello")


def spec(
    attrs: dict[str, str] | None = None,
    headers: list[tuple[str, str]] | None = None,
    contents: list[EmbeddedContent] | None = None,
) -> MessageSpec:
    return build_message(attrs or {}, headers or [], list(contents or []), LIMITS)


def wire(message: Message) -> Message:
    """The message as a receiver decodes it."""
    received = Message()
    received.decode(message.encode())
    return received


def sent(message_spec: MessageSpec, parts: list[Part | None] | None = None) -> Message:
    """to_amqp, then over the wire."""
    contents: list[Part | None] = list(parts) if parts is not None else []
    return wire(to_amqp(message_spec, contents))


def received(**fields: Any) -> MessageSpec:
    """from_amqp of a message a foreign AMQP 1.0 client built with these fields."""
    return from_amqp(wire(Message(**fields)))


def body_bytes(message: Message) -> bytes:
    """A data section's body (proton decodes it as a memoryview)."""
    body: Any = message.body
    return bytes(body)


def only_content(message_spec: MessageSpec) -> EmbeddedContent:
    (content,) = message_spec.contents
    assert isinstance(content, EmbeddedContent)
    return content


def parts_of(message_spec: MessageSpec) -> list[Part | None]:
    """A received message's contents as the parts a pipe would deliver."""
    return [only_content(message_spec)] if message_spec.contents else []


# ---------------------------------------------------------------- properties, outbound
@pytest.mark.parametrize(
    ("attrs", "field", "expected"),
    [
        pytest.param({"address": "orders.eu"}, "subject", "orders.eu", id="address-subject"),
        pytest.param({}, "subject", None, id="no-address-no-subject"),
        pytest.param({"message_id": "m-1"}, "id", "m-1", id="message-id"),
        pytest.param({"correlation_id": "c-9"}, "correlation_id", "c-9", id="correlation-id"),
        pytest.param({"reply_to": "/queue/r"}, "reply_to", "/queue/r", id="reply-to"),
        pytest.param({"user_id": "zoë"}, "user_id", "zoë".encode(), id="user-id-utf8"),
        pytest.param({"delivery_mode": "2"}, "durable", True, id="persistent"),
        pytest.param({"delivery_mode": "1"}, "durable", False, id="transient"),
        pytest.param({}, "durable", False, id="no-delivery-mode"),
        pytest.param({"priority": "0"}, "priority", 0, id="priority-0"),
        pytest.param({"priority": "9"}, "priority", 9, id="priority-9"),
        pytest.param({}, "priority", 4, id="no-priority-default-4"),
        pytest.param({"expiration": "1001"}, "ttl", 1.001, id="ttl-1001ms"),
        pytest.param({"expiration": "1"}, "ttl", 0.001, id="ttl-1ms"),
        pytest.param({"expiration": "0"}, "ttl", 0.001, id="ttl-0-becomes-1ms"),
        pytest.param({"expiration": str(2**32 - 1)}, "ttl", (2**32 - 1) / 1000, id="ttl-max"),
        pytest.param({"timestamp": "1700000000"}, "creation_time", 1700000000.0, id="timestamp"),
        pytest.param({"timestamp": "2024-01-01"}, "creation_time", 0.0, id="text-timestamp"),
    ],
)
def test_outbound_property(attrs: dict[str, str], field: str, expected: object) -> None:
    assert getattr(sent(spec(attrs)), field) == expected


def test_outbound_ttl_is_exact_to_the_millisecond() -> None:
    # proton truncates seconds * 1000; 1001 ms read as 1.001 s would become 1000.
    for ms in (1001, 1003, 4097, 999_999, 2**31 + 7):
        message = sent(spec({"expiration": str(ms)}))
        assert round(message.ttl * 1000) == ms
        assert int(message.ttl * 1000) in (ms, ms - 1)  # what a float reader may see


@pytest.mark.parametrize(
    ("attrs", "expected"),
    [
        pytest.param({"type": "order"}, {"restms.type": "order"}, id="type"),
        pytest.param({"app_id": "shop"}, {"restms.app_id": "shop"}, id="app-id"),
        pytest.param({"sender_id": "s1"}, {"restms.sender_id": "s1"}, id="sender-id"),
        pytest.param({"timestamp": "today"}, {"restms.timestamp": "today"}, id="text-timestamp"),
        pytest.param({"timestamp": "0"}, {"restms.timestamp": "0"}, id="zero-timestamp"),
        pytest.param({"timestamp": "007"}, {"restms.timestamp": "007"}, id="leading-zero"),
        pytest.param(
            {"timestamp": str(MAX_CREATION_SECONDS + 1)},
            {"restms.timestamp": str(MAX_CREATION_SECONDS + 1)},
            id="beyond-exact-milliseconds",
        ),
        pytest.param({"timestamp": "1700000000"}, None, id="digits-are-creation-time"),
        pytest.param({"message_id": "m"}, None, id="fields-are-not-properties"),
    ],
)
def test_outbound_reserved_application_properties(
    attrs: dict[str, str], expected: dict[str, str] | None
) -> None:
    assert sent(spec(attrs)).properties == expected


# ---------------------------------------------------------------- properties, inbound
@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        pytest.param({"id": "m-1"}, {"message_id": "m-1"}, id="str-id"),
        pytest.param({"id": 42}, {"message_id": "42"}, id="ulong-id"),
        pytest.param({"id": ulong(2**64 - 1)}, {"message_id": str(2**64 - 1)}, id="max-ulong-id"),
        pytest.param(
            {"id": uuid.UUID(int=0x1234)},
            {"message_id": "00000000-0000-0000-0000-000000001234"},
            id="uuid-id",
        ),
        pytest.param({"id": b"abc"}, {"message_id": "abc"}, id="utf8-binary-id"),
        pytest.param({"id": b"\xff\x00"}, {"message_id": "ff00"}, id="binary-id-hex"),
        pytest.param({"id": b"a\x00b"}, {"message_id": "610062"}, id="binary-id-with-nul-hex"),
        pytest.param({"correlation_id": "c"}, {"correlation_id": "c"}, id="str-correlation"),
        pytest.param({"correlation_id": 7}, {"correlation_id": "7"}, id="ulong-correlation"),
        pytest.param(
            {"correlation_id": uuid.UUID(int=1)},
            {"correlation_id": "00000000-0000-0000-0000-000000000001"},
            id="uuid-correlation",
        ),
        pytest.param(
            {"correlation_id": b"\xfe\xed"}, {"correlation_id": "feed"}, id="binary-correlation"
        ),
        pytest.param({"reply_to": "/queue/r"}, {"reply_to": "/queue/r"}, id="reply-to"),
        pytest.param({"user_id": "zoë".encode()}, {"user_id": "zoë"}, id="user-id"),
        pytest.param({"durable": True}, {"delivery_mode": "2"}, id="durable"),
        pytest.param({"durable": False}, {}, id="not-durable-no-property"),
        pytest.param({"priority": 0}, {"priority": "0"}, id="priority-0"),
        pytest.param({"priority": 9}, {"priority": "9"}, id="priority-9"),
        pytest.param({"priority": 4}, {}, id="priority-4-is-the-default"),
        pytest.param({"priority": 10}, {"priority": "9"}, id="priority-10-clamped"),
        pytest.param({"priority": 255}, {"priority": "9"}, id="priority-255-clamped"),
        pytest.param({"ttl": 2.5}, {"expiration": "2500"}, id="ttl"),
        pytest.param({"ttl": 0.0015}, {"expiration": "1"}, id="ttl-sub-millisecond"),
        pytest.param({"creation_time": 1700000000}, {"timestamp": "1700000000"}, id="created"),
        pytest.param(
            {"creation_time": 1700000000.999}, {"timestamp": "1700000000"}, id="created-floor"
        ),
        pytest.param(
            {"properties": {"restms.type": "t", "restms.app_id": "a", "restms.sender_id": "s"}},
            {"type": "t", "app_id": "a", "sender_id": "s"},
            id="reserved-application-properties",
        ),
        pytest.param(
            {"properties": {"restms.timestamp": "noon"}}, {"timestamp": "noon"}, id="text-timestamp"
        ),
        pytest.param(
            {"creation_time": 5, "properties": {"restms.timestamp": "noon"}},
            {"timestamp": "noon"},
            id="restms-timestamp-wins",
        ),
        pytest.param(
            {"properties": {"restms.type": ulong(3)}}, {"type": "3"}, id="non-string-reserved"
        ),
    ],
)
def test_inbound_property(fields: dict[str, Any], expected: dict[str, str]) -> None:
    message = received(body=b"x", **fields)
    assert dict(message.props) == expected
    assert message.headers == ()  # reserved properties are not shown as headers


def test_inbound_props_come_in_restms_order() -> None:
    message = received(
        body=b"",
        user_id=b"u",
        priority=1,
        id="m",
        creation_time=60,
        properties={"restms.sender_id": "s", "restms.type": "t"},
    )
    assert [name for name, _ in message.props] == [
        "message_id",
        "priority",
        "timestamp",
        "type",
        "user_id",
        "sender_id",
    ]


@pytest.mark.parametrize(
    ("address_from", "fields", "expected_address", "expected_headers"),
    [
        pytest.param("subject", {"subject": "a.b"}, "a.b", (), id="subject"),
        pytest.param("subject", {}, "", (), id="subject-missing"),
        pytest.param(
            "subject", {"subject": "s", "address": "q"}, "s", (("amqp.to", "q"),), id="subject-to"
        ),
        pytest.param("to", {"address": "/queue/q"}, "/queue/q", (), id="to"),
        pytest.param("to", {}, "", (), id="to-missing"),
        pytest.param(
            "to",
            {"address": "q", "subject": "s"},
            "q",
            (("amqp.subject", "s"),),
            id="to-keeps-subject-as-header",
        ),
        pytest.param(
            "header:route",
            {"properties": {"route": "r.1"}},
            "r.1",
            (("route", "r.1"),),
            id="header",
        ),
        pytest.param(
            "header:route",
            {"properties": {"route": 12}},
            "12",
            (("route", "12"),),
            id="header-int",
        ),
        pytest.param("header:route", {}, "", (), id="header-missing"),
        pytest.param(
            "header:route",
            {"subject": "s", "properties": {"other": "x"}},
            "",
            (("other", "x"), ("amqp.subject", "s")),
            id="header-missing-subject-kept",
        ),
    ],
)
def test_inbound_address(
    address_from: str,
    fields: dict[str, Any],
    expected_address: str,
    expected_headers: tuple[tuple[str, str], ...],
) -> None:
    result = from_amqp(wire(Message(body=b"", **fields)), address_from=address_from)
    assert result.address == expected_address
    assert result.headers == expected_headers


# ---------------------------------------------------------------- headers
@pytest.mark.parametrize(
    ("header", "field", "expected"),
    [
        pytest.param(("amqp.content-encoding", "gzip"), "content_encoding", "gzip", id="encoding"),
        pytest.param(("amqp.to", "/exchange/x/k"), "address", "/exchange/x/k", id="to"),
        pytest.param(("amqp.group-id", "g"), "group_id", "g", id="group-id"),
        pytest.param(("amqp.group-sequence", "17"), "group_sequence", 17, id="group-sequence"),
        pytest.param(
            ("amqp.group-sequence", str(2**32 - 1)), "group_sequence", 2**32 - 1, id="max-seq"
        ),
        pytest.param(("amqp.reply-to-group-id", "rg"), "reply_to_group_id", "rg", id="rg"),
        pytest.param(("amqp.subject", "s"), "subject", "s", id="subject-without-address"),
    ],
)
def test_outbound_field_header(header: tuple[str, str], field: str, expected: object) -> None:
    message = sent(spec(headers=[header]))
    assert getattr(message, field) == expected
    assert message.properties is None


def test_outbound_address_wins_over_amqp_subject() -> None:
    message = sent(spec({"address": "a"}, [("amqp.subject", "s")]))
    assert message.subject == "a"
    assert message.properties is None


def test_outbound_headers_are_string_application_properties() -> None:
    headers = [("x-id", "7"), ("lang", "fr"), ("empty", ""), ("amqp.other", "kept")]
    message = sent(spec(headers=headers))
    assert message.properties == dict(headers)
    properties: dict[object, object] = dict(message.properties or {})
    assert all(type(key) is str and type(value) is str for key, value in properties.items())


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        pytest.param({"content_encoding": "gzip"}, ("amqp.content-encoding", "gzip"), id="enc"),
        pytest.param({"address": "/queue/q"}, ("amqp.to", "/queue/q"), id="to"),
        pytest.param({"group_id": "g"}, ("amqp.group-id", "g"), id="group-id"),
        pytest.param({"group_sequence": 3}, ("amqp.group-sequence", "3"), id="group-sequence"),
        pytest.param({"reply_to_group_id": "rg"}, ("amqp.reply-to-group-id", "rg"), id="rg"),
    ],
)
def test_inbound_field_header(fields: dict[str, Any], expected: tuple[str, str]) -> None:
    assert received(body=b"x", **fields).headers == (expected,)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        pytest.param("text", "text", id="str"),
        pytest.param("", "", id="empty-str"),
        pytest.param(True, "true", id="true"),
        pytest.param(False, "false", id="false"),
        pytest.param(0, "0", id="zero"),
        pytest.param(-12, "-12", id="negative"),
        pytest.param(ulong(2**64 - 1), str(2**64 - 1), id="ulong"),
        pytest.param(ubyte(200), "200", id="ubyte"),
        pytest.param(1.5, "1.5", id="float"),
        pytest.param(None, "", id="null"),
        pytest.param(b"\x00\xff", "AP8=", id="binary-base64"),
        pytest.param(b"", "", id="empty-binary"),
        pytest.param(uuid.UUID(int=2), "00000000-0000-0000-0000-000000000002", id="uuid"),
        pytest.param(symbol("sym"), "sym", id="symbol"),
        pytest.param(char("c"), "c", id="char"),
        pytest.param(timestamp(1700000000123), "1700000000123", id="timestamp"),
    ],
)
def test_inbound_application_property_value(value: object, expected: str) -> None:
    message = received(body=b"", properties={"h": value})
    assert message.headers == (("h", expected),)
    assert all(type(value) is str for _, value in message.headers)


def test_inbound_headers_keep_application_property_order_then_fields() -> None:
    message = received(
        body="t",
        group_id="g",
        address="q",
        properties={"z": "1", "a": "2", "restms.type": "t", "m": "3"},
    )
    assert message.headers == (
        ("z", "1"),
        ("a", "2"),
        ("m", "3"),
        ("amqp.to", "q"),
        ("amqp.group-id", "g"),
        ("amqp.body", "value"),
    )


def test_inbound_header_limit() -> None:
    properties = {f"h{i}": "v" for i in range(3)}
    message = Message(body=b"", properties=properties)
    assert len(from_amqp(wire(message), limits=MessageLimits(max_headers=3)).headers) == 3
    with pytest.raises(Unmappable, match="4 headers, over the limit of 3"):
        from_amqp(
            wire(Message(body="s", properties=properties)), limits=MessageLimits(max_headers=3)
        )


# ---------------------------------------------------------------- bodies, outbound
@pytest.mark.parametrize(
    ("parts", "body", "content_type"),
    [
        pytest.param([], b"", "None", id="no-content-empty-data"),
        pytest.param([None], b"", "None", id="deleted-content-skipped"),
        pytest.param([TEXT], b"hello", "text/plain", id="embedded-plain"),
        pytest.param(
            [EmbeddedContent(type="image/png", encoding="base64", value="AAH/")],
            b"\x00\x01\xff",
            "image/png",
            id="embedded-base64",
        ),
        pytest.param(
            [Blob(data=b"\x89PNG\x00", content_type="image/png")],
            b"\x89PNG\x00",
            "image/png",
            id="staged-blob",
        ),
        pytest.param(
            [None, Blob(data=b"{}", content_type="application/json")],
            b"{}",
            "application/json",
            id="one-left",
        ),
        pytest.param([Blob(data=b"raw", content_type="")], b"raw", "None", id="no-content-type"),
    ],
)
def test_outbound_body_is_one_data_section(
    parts: list[Part | None], body: bytes, content_type: str
) -> None:
    message = to_amqp(spec(), parts)
    assert message.inferred is True
    assert message.body == body
    received_message = wire(message)
    assert received_message.inferred is True  # a data section, not an amqp-value
    assert body_bytes(received_message) == body
    assert received_message.content_type == content_type  # proton reads absent as "None"


def test_outbound_data_section_is_raw_bytes_on_the_wire() -> None:
    # One data section (descriptor 0x75) holding exactly the content's bytes.
    encoded = to_amqp(spec(), [Blob(data=b"\x00\x01raw", content_type="application/x")]).encode()
    assert encoded.endswith(b"\x00Su\xa0\x05\x00\x01raw")


@pytest.mark.parametrize(
    ("part", "expected"),
    [
        pytest.param(EmbeddedContent(type="text/plain", value="héllo"), "héllo", id="text"),
        pytest.param(
            EmbeddedContent(type="Text/Markdown; charset=utf-8", value="# t"), "# t", id="text-ci"
        ),
        pytest.param(
            EmbeddedContent(type="application/json", value='{"a": [1, "x", null, true]}'),
            {"a": [1, "x", None, True]},
            id="json-map",
        ),
        pytest.param(
            EmbeddedContent(type="application/json", value="[1,2]"), [1, 2], id="json-list"
        ),
        pytest.param(EmbeddedContent(type="application/json", value="3.5"), 3.5, id="json-number"),
        pytest.param(EmbeddedContent(type="application/json", value='"s"'), "s", id="json-string"),
        pytest.param(
            EmbeddedContent(type="application/octet-stream", encoding="base64", value="AP8="),
            b"\x00\xff",
            id="binary-value",
        ),
    ],
)
def test_outbound_amqp_value_restored(part: EmbeddedContent, expected: object) -> None:
    message = sent(spec(headers=[("amqp.body", "value")]), [part])
    assert message.inferred is False
    body = bytes(message.body) if isinstance(message.body, memoryview) else message.body
    assert body == expected
    assert type(body) is type(expected)
    assert message.properties is None  # amqp.body is not an application property
    assert message.content_type == part.type


def test_outbound_string_kind_restores_a_string_whatever_the_type() -> None:
    part = EmbeddedContent(type="application/json", value='{"a":1}')
    message = sent(spec(headers=[("amqp.body", "string")]), [part])
    assert message.body == '{"a":1}'
    assert message.inferred is False


def test_outbound_value_kind_without_content_is_an_empty_data_section() -> None:
    message = sent(spec(headers=[("amqp.body", "value")]), [])
    assert (message.inferred, body_bytes(message)) == (True, b"")


# ---------------------------------------------------------------- bodies, inbound
@pytest.mark.parametrize(
    ("fields", "content", "header"),
    [
        pytest.param(
            {"body": b"\x00\x01", "inferred": True},
            EmbeddedContent(type="application/octet-stream", encoding="base64", value="AAE="),
            None,
            id="data-binary",
        ),
        pytest.param(
            {"body": b"plain text", "inferred": True, "content_type": "text/plain"},
            EmbeddedContent(type="text/plain", encoding="plain", value="plain text"),
            None,
            id="data-text",
        ),
        pytest.param(
            {"body": b"\x00\x01"},
            EmbeddedContent(type="application/octet-stream", encoding="base64", value="AAE="),
            None,
            id="value-binary",
        ),
        pytest.param(
            {"body": b"", "inferred": True, "content_type": "text/plain"},
            EmbeddedContent(type="text/plain", encoding="plain", value=""),
            None,
            id="empty-data-with-type",
        ),
        pytest.param({"body": b"", "inferred": True}, None, None, id="empty-data-no-content"),
        pytest.param({"body": None}, None, None, id="no-body"),
        pytest.param(
            {"body": "héllo"},
            EmbeddedContent(type="text/plain; charset=utf-8", encoding="plain", value="héllo"),
            "value",
            id="value-string",
        ),
        pytest.param(
            {"body": "<b/>", "content_type": "text/html"},
            EmbeddedContent(type="text/html", encoding="plain", value="<b/>"),
            "value",
            id="value-string-typed",
        ),
        pytest.param(
            {"body": '{"a":1}', "content_type": "application/json"},
            EmbeddedContent(type="application/json", encoding="plain", value='{"a":1}'),
            "string",
            id="value-string-non-text-type",
        ),
        pytest.param(
            {"body": "nul\x00"},
            EmbeddedContent(type="text/plain; charset=utf-8", encoding="base64", value="bnVsAA=="),
            "value",
            id="value-string-with-nul",
        ),
        pytest.param(
            {"body": {"k": "v", "n": 1}, "content_type": "text/plain"},
            EmbeddedContent(type="application/json", value='{"k":"v","n":1}'),
            "value",
            id="value-map",
        ),
        pytest.param(
            {"body": [1, "two", None, True]},
            EmbeddedContent(type="application/json", value='[1,"two",null,true]'),
            "value",
            id="value-list",
        ),
        pytest.param(
            {"body": [1, 2], "inferred": True},
            EmbeddedContent(type="application/json", value="[1,2]"),
            "value",
            id="sequence",
        ),
        pytest.param(
            {"body": 42}, EmbeddedContent(type="application/json", value="42"), "value", id="int"
        ),
        pytest.param(
            {"body": False},
            EmbeddedContent(type="application/json", value="false"),
            "value",
            id="bool",
        ),
        pytest.param(
            {"body": 2.5},
            EmbeddedContent(type="application/json", value="2.5"),
            "value",
            id="float",
        ),
        pytest.param(
            {"body": float("nan")},
            EmbeddedContent(type="application/json", value='"nan"'),
            "value",
            id="nan-as-text",
        ),
        pytest.param(
            {"body": uuid.UUID(int=3)},
            EmbeddedContent(
                type="application/json", value='"00000000-0000-0000-0000-000000000003"'
            ),
            "value",
            id="uuid",
        ),
        pytest.param(
            {"body": symbol("s")},
            EmbeddedContent(type="application/json", value='"s"'),
            "value",
            id="symbol",
        ),
        pytest.param(
            {"body": {"b": b"\x00\xff", "u": uuid.UUID(int=0), "t": timestamp(5), 7: "int key"}},
            EmbeddedContent(
                type="application/json",
                value='{"b":"AP8=","u":"00000000-0000-0000-0000-000000000000","t":5,"7":"int key"}',
            ),
            "value",
            id="map-of-non-json-types",
        ),
        pytest.param(
            {"body": {symbol("s"): [b"x", {"n": None}]}},
            EmbeddedContent(type="application/json", value='{"s":["eA==",{"n":null}]}'),
            "value",
            id="nested",
        ),
        pytest.param(
            {"body": Described(symbol("d"), 1)},
            EmbeddedContent(type="application/json", value="\"Described(symbol('d'), 1)\""),
            "value",
            id="described-as-text",
        ),
        pytest.param(
            {"body": Array(None, Data.INT, 1, 2, 3)},
            EmbeddedContent(type="application/json", value="[1,2,3]"),
            "value",
            id="array",
        ),
    ],
)
def test_inbound_body(
    fields: dict[str, Any], content: EmbeddedContent | None, header: str | None
) -> None:
    message = received(**fields)
    assert message.contents == (() if content is None else (content,))
    assert message.headers == (() if header is None else (("amqp.body", header),))


@pytest.mark.parametrize(
    ("data", "encoding"),
    [
        pytest.param(b"", "plain", id="empty"),
        pytest.param(b"ascii", "plain", id="ascii"),
        pytest.param("ünïcödé ✓ 𝄞".encode(), "plain", id="utf8"),
        pytest.param(b"tab\tlf\ncr\r", "plain", id="allowed-whitespace"),
        pytest.param(b"nul\x00", "base64", id="nul"),
        pytest.param(b"bell\x07", "base64", id="c0-control"),
        pytest.param(b"esc\x1b", "base64", id="escape"),
        pytest.param("\ufffe".encode(), "base64", id="u-fffe"),
        pytest.param("\uffff".encode(), "base64", id="u-ffff"),
        pytest.param(b"\xed\xa0\x80", "base64", id="encoded-surrogate"),
        pytest.param(b"\xff\xfe", "base64", id="not-utf8"),
        pytest.param(b"\xc3", "base64", id="truncated-utf8"),
        pytest.param(bytes(range(256)) * 100, "base64", id="long-binary-no-line-breaks"),
    ],
)
def test_inbound_content_encoding(data: bytes, encoding: str) -> None:
    (content,) = received(body=data, inferred=True, content_type="application/x").contents
    assert isinstance(content, EmbeddedContent)
    assert content.encoding == encoding
    assert content.data() == data
    if encoding == "base64":
        assert content.value == base64.b64encode(data).decode()
        assert "\n" not in content.value


def test_inbound_max_size() -> None:
    message = wire(Message(body=b"x" * 10, inferred=True))
    assert only_content(from_amqp(message, max_size=10)).data() == b"x" * 10
    with pytest.raises(Unmappable, match=r"11 bytes is over the limit of 10 bytes"):
        from_amqp(wire(Message(body=b"x" * 11, inferred=True)), max_size=10)
    with pytest.raises(Unmappable, match=r"\b7 bytes is over the limit of 6 bytes"):
        from_amqp(wire(Message(body={"a": 1})), max_size=6)  # JSON {"a":1}
    with pytest.raises(Unmappable, match=r"\b6 bytes is over the limit of 5 bytes"):
        from_amqp(wire(Message(body="héllo")), max_size=5)  # UTF-8 bytes, not characters


# ---------------------------------------------------------------- Unmappable
@pytest.mark.parametrize(
    ("message_spec", "parts", "reason"),
    [
        pytest.param(
            spec(), [TEXT, TEXT], "a message with 2 contents cannot be one AMQP body", id="2-parts"
        ),
        pytest.param(
            spec(), [TEXT, None, TEXT, TEXT], "a message with 3 contents", id="3-of-4-parts"
        ),
        pytest.param(
            spec(headers=[("restms.type", "t")]), [], "reserved for the type", id="reserved-type"
        ),
        pytest.param(
            spec(headers=[("restms.timestamp", "t")]), [], "restms.timestamp", id="reserved-ts"
        ),
        pytest.param(spec(headers=[("h", "1"), ("h", "2")]), [], "appears twice", id="duplicate"),
        pytest.param(
            spec(headers=[("amqp.to", "a"), ("amqp.to", "b")]), [], "twice", id="duplicate-field"
        ),
        pytest.param(
            spec(headers=[("amqp.group-sequence", "x")]), [], "group-sequence", id="bad-sequence"
        ),
        pytest.param(
            spec(headers=[("amqp.group-sequence", str(2**32))]),
            [],
            "0 to 4294967295",
            id="sequence-too-big",
        ),
        pytest.param(
            spec(headers=[("amqp.body", "sequence")]), [TEXT], "must be string or value", id="kind"
        ),
        pytest.param(
            spec(headers=[("amqp.body", "value")]),
            [Blob(data=b"\xff", content_type="text/plain")],
            "not UTF-8 cannot be an AMQP string",
            id="value-text-not-utf8",
        ),
        pytest.param(
            spec(headers=[("amqp.body", "value")]),
            [Blob(data=b"{oops", content_type="application/json")],
            "application/json content that is not JSON",
            id="value-not-json",
        ),
        pytest.param(
            spec(headers=[("amqp.body", "value")]),
            [Blob(data=b"null", content_type="application/json")],
            "JSON null",
            id="value-json-null",
        ),
        pytest.param(
            spec(headers=[("amqp.body", "value")]),
            [Blob(data=b"[18446744073709551615]", content_type="application/json")],
            "int too big",
            id="value-json-int-beyond-long",
        ),
        pytest.param(
            MessageSpec(props=(("priority", "high"),)), [], "priority must be 0 to 9", id="prio"
        ),
        pytest.param(MessageSpec(props=(("priority", "10"),)), [], "0 to 9", id="priority-10"),
        pytest.param(
            MessageSpec(props=(("delivery_mode", "3"),)), [], "1 or 2", id="delivery-mode"
        ),
        pytest.param(
            MessageSpec(props=(("expiration", "-1"),)), [], "expiration", id="negative-ttl"
        ),
        pytest.param(
            MessageSpec(props=(("expiration", str(2**32)),)), [], "expiration", id="ttl-too-big"
        ),
        pytest.param(
            MessageSpec(headers=(("h", "\ud800"),)), [], "cannot map the message to AMQP", id="surr"
        ),
        pytest.param(
            spec(),
            [EmbeddedContent(encoding="base64", value="not base64!")],
            "cannot map the message to AMQP 1.0",
            id="bad-base64",
        ),
        pytest.param(
            MessageSpec(headers=(("amqp.content-encoding", "None"),)),
            [],
            "'None' cannot travel: proton reads it as no content-encoding",
            id="content-encoding-None",
        ),
    ],
)
def test_to_amqp_unmappable(
    message_spec: MessageSpec, parts: list[Part | None], reason: str
) -> None:
    with pytest.raises(Unmappable, match=reason) as caught:
        to_amqp(message_spec, parts)
    assert str(caught.value)


@pytest.mark.parametrize(
    ("message", "options", "reason"),
    [
        pytest.param(
            Message(user_id=b"\xff\xfe"), {}, "user-id that is not UTF-8", id="user-id-not-utf8"
        ),
        pytest.param(
            Message(subject="x" * 1025), {}, "address longer than 1024", id="address-too-long"
        ),
        pytest.param(Message(subject="a\x01b"), {}, "address holds a character", id="nul-address"),
        pytest.param(Message(id="m\x01"), {}, "message_id holds a character", id="control-id"),
        pytest.param(
            Message(reply_to="\ufffe"), {}, "reply_to holds a character", id="fffe-reply-to"
        ),
        pytest.param(
            Message(properties={"h": "v\x00"}), {}, "header 'h' holds a character", id="header"
        ),
        pytest.param(
            Message(properties={"h\x1f": "v"}), {}, "holds a character XML", id="header-name"
        ),
        pytest.param(
            Message(properties={"restms.app_id": "\x02"}),
            {},
            "app_id holds",
            id="reserved-property-value",
        ),
        pytest.param(Message(properties={"": "v"}), {}, "empty name", id="empty-header-name"),
        pytest.param(
            Message(properties={"amqp.to": "q"}), {}, "reserved for the AMQP field", id="amqp.to"
        ),
        pytest.param(Message(properties={"amqp.body": "value"}), {}, "reserved", id="amqp.body"),
        pytest.param(
            Message(properties={"r": "a" * 1025}),
            {"address_from": "header:r"},
            "address longer",
            id="header-address-too-long",
        ),
        pytest.param(
            Message(body=b"x" * 5, inferred=True), {"max_size": 4}, "5 bytes", id="too-big"
        ),
        pytest.param(
            Message(properties={"a": 1, "b": 2}),
            {"limits": MessageLimits(max_headers=1)},
            "2 headers, over the limit of 1",
            id="too-many-headers",
        ),
        pytest.param(
            Message(content_encoding="gzip", group_id="g"),
            {"limits": MessageLimits(max_headers=1)},
            "2 headers",
            id="field-headers-count",
        ),
    ],
)
def test_from_amqp_unmappable(message: Message, options: dict[str, Any], reason: str) -> None:
    with pytest.raises(Unmappable, match=reason):
        from_amqp(wire(message), **options)


def test_foreign_errors_are_chained() -> None:
    with pytest.raises(Unmappable) as caught:
        from_amqp(wire(Message(subject="x" * 1025)))
    assert isinstance(caught.value.__cause__, RestMSError)
    with pytest.raises(Unmappable) as caught:
        to_amqp(MessageSpec(headers=(("h", "\udc00"),)), [])
    assert isinstance(caught.value.__cause__, UnicodeError)
    with pytest.raises(Unmappable) as caught:
        to_amqp(spec(), [EmbeddedContent(encoding="base64", value="a")])
    assert isinstance(caught.value.__cause__, ValueError)


def test_unmappable_is_in_the_gateway_tree() -> None:
    error = Unmappable("why")
    assert isinstance(error, RestMSError)
    assert (str(error), error.status) == ("why", 422)


def test_bad_application_properties_section_is_unmappable() -> None:
    message = wire(Message(body=b""))
    setattr(message, "properties", ["not", "a", "map"])  # noqa: B010 (proton types it None)
    with pytest.raises(Unmappable, match="application properties are a list"):
        from_amqp(message)


def test_bad_address_from_is_a_configuration_error() -> None:
    with pytest.raises(ValueError, match="address_from"):
        from_amqp(wire(Message(body=b"")), address_from="reply_to")


# ---------------------------------------------------------------- configuration helpers
@pytest.mark.parametrize("value", ["subject", "to", "header:route", "header:x-y.z"])
def test_check_address_from_accepts(value: str) -> None:
    assert check_address_from(value) == value


@pytest.mark.parametrize("value", ["", "Subject", "header:", "header", "reply_to", " to"])
def test_check_address_from_refuses(value: str) -> None:
    with pytest.raises(ValueError, match="subject, to or header:NAME"):
        check_address_from(value)


@pytest.mark.parametrize(
    ("template", "address", "expected"),
    [
        pytest.param("/exchange/amq.topic/{address}", "a.b", "/exchange/amq.topic/a.b", id="topic"),
        pytest.param("/queue/{address}", "orders", "/queue/orders", id="queue"),
        pytest.param("/queue/fixed", "ignored", "/queue/fixed", id="no-placeholder"),
        pytest.param("{address}/{address}", "x", "x/x", id="twice"),
        pytest.param("/topic/{address}", "a/b c%", "/topic/a/b c%", id="passed-as-is"),
        pytest.param("/topic/{address}", "", "/topic/", id="empty-address"),
        pytest.param("/t/{address}", "{address}", "/t/{address}", id="no-recursion"),
    ],
)
def test_render_target(template: str, address: str, expected: str) -> None:
    assert check_target(template) == template
    assert render_target(template, address) == expected


@pytest.mark.parametrize("template", ["/q/{addr}", "/q/{", "/q/}", "{{address}}", "/q/{0}"])
def test_bad_target_template(template: str) -> None:
    with pytest.raises(ValueError, match="no other braces"):
        check_target(template)
    with pytest.raises(ValueError, match="no other braces"):
        render_target(template, "a")


# ---------------------------------------------------------------- a foreign AMQP 1.0 client
def test_message_from_a_foreign_client() -> None:
    message = Message(
        body={"order": 17, "items": ["a", "b"], "rush": True},
        id=uuid.UUID("12345678-1234-5678-1234-567812345678"),
        correlation_id=99,
        subject="orders.eu",
        reply_to="/queue/replies",
        durable=True,
        priority=7,
        ttl=30,
        creation_time=1700000000.25,
        user_id=b"alice",
        content_type="application/json",
        content_encoding="identity",
        group_id="batch-1",
        group_sequence=2,
        address="/exchange/orders",
        properties={"tenant": "acme", "retries": 3, "urgent": True, "raw": b"\x01"},
        annotations={symbol("x-opt-routing-key"): "ignored"},  # not carried
    )
    result = from_amqp(wire(message))
    assert result == MessageSpec(
        address="orders.eu",
        props=(
            ("message_id", "12345678-1234-5678-1234-567812345678"),
            ("reply_to", "/queue/replies"),
            ("correlation_id", "99"),
            ("delivery_mode", "2"),
            ("priority", "7"),
            ("expiration", "30000"),
            ("timestamp", "1700000000"),
            ("user_id", "alice"),
        ),
        headers=(
            ("tenant", "acme"),
            ("retries", "3"),
            ("urgent", "true"),
            ("raw", "AQ=="),
            ("amqp.content-encoding", "identity"),
            ("amqp.to", "/exchange/orders"),
            ("amqp.group-id", "batch-1"),
            ("amqp.group-sequence", "2"),
            ("amqp.body", "value"),
        ),
        contents=(
            EmbeddedContent(
                type="application/json", value='{"order":17,"items":["a","b"],"rush":true}'
            ),
        ),
    )
    # And back out: the same fields, the map as a map, ids as text.
    back = wire(to_amqp(result, parts_of(result)))
    assert back.body == {"order": 17, "items": ["a", "b"], "rush": True}
    assert (back.id, back.correlation_id) == ("12345678-1234-5678-1234-567812345678", "99")
    assert (back.subject, back.reply_to, back.durable, back.priority) == (
        "orders.eu",
        "/queue/replies",
        True,
        7,
    )
    assert (round(back.ttl * 1000), back.creation_time, back.user_id) == (
        30000,
        1700000000.0,
        b"alice",
    )
    assert (back.content_encoding, back.address, back.group_id, back.group_sequence) == (
        "identity",
        "/exchange/orders",
        "batch-1",
        2,
    )
    assert back.properties == {"tenant": "acme", "retries": "3", "urgent": "true", "raw": "AQ=="}


def test_text_message_from_a_foreign_client_round_trips_as_a_string() -> None:
    result = from_amqp(wire(Message(body="hello ✓", subject="greetings")))
    assert result.contents == (
        EmbeddedContent(type="text/plain; charset=utf-8", encoding="plain", value="hello ✓"),
    )
    back = wire(to_amqp(result, parts_of(result)))
    assert (back.body, back.inferred, back.subject) == ("hello ✓", False, "greetings")
    assert back.content_type == "text/plain; charset=utf-8"


# ---------------------------------------------------------------- round trips
def roundtrip(message_spec: MessageSpec, parts: list[Part | None]) -> MessageSpec:
    """gateway -> to_amqp -> bytes on the wire -> a fresh Message -> from_amqp."""
    return from_amqp(wire(to_amqp(message_spec, parts)))


ROUNDTRIP_ATTRS = {
    "address": "orders.eu/north",
    "message_id": "m-1",
    "reply_to": "/queue/r",
    "correlation_id": "c-1",
    "delivery_mode": "2",
    "priority": "0",
    "expiration": "4294967295",
    "timestamp": "1700000000",
    "type": "order",
    "user_id": "zoë",
    "app_id": "shop",
    "sender_id": "node-7",
}


@pytest.mark.parametrize(
    ("attrs", "headers", "part"),
    [
        pytest.param(ROUNDTRIP_ATTRS, [("lang", "fr"), ("n", "")], TEXT, id="every-property"),
        pytest.param({}, [], None, id="empty"),
        pytest.param({"timestamp": "yesterday"}, [], None, id="text-timestamp"),
        pytest.param({"timestamp": "0"}, [], None, id="zero-timestamp"),
        pytest.param({"expiration": "1"}, [], None, id="ttl-1"),
        pytest.param({"priority": "9"}, [("amqp.body", "value")], TEXT, id="string-value"),
        pytest.param(
            {},
            [
                ("x", "1"),
                ("amqp.content-encoding", "gzip"),
                ("amqp.to", "/queue/q"),
                ("amqp.group-id", "g"),
                ("amqp.group-sequence", "5"),
                ("amqp.reply-to-group-id", "rg"),
            ],
            Blob(data=b"\x1f\x8b\x00", content_type="application/gzip"),
            id="fields-and-binary",
        ),
        pytest.param(
            {"address": "json"},
            [("amqp.body", "value")],
            EmbeddedContent(type="application/json", value='{"a":[1,2.5,"x",null]}'),
            id="json-value",
        ),
        pytest.param(
            {},
            [("amqp.body", "string")],
            EmbeddedContent(type="application/json", value='{"a":1}'),
            id="string-kind",
        ),
    ],
)
def test_roundtrip(
    attrs: dict[str, str], headers: list[tuple[str, str]], part: Part | None
) -> None:
    original = spec(attrs, headers)
    back = roundtrip(original, [part])
    assert (back.address, back.props, back.headers) == (
        original.address,
        original.props,
        original.headers,
    )
    if part is None:
        assert back.contents == ()
    else:
        (content,) = back.contents
        assert isinstance(content, EmbeddedContent)
        data, content_type = (
            (part.data, part.content_type) if isinstance(part, Blob) else (part.data(), part.type)
        )
        assert (content.data(), content.type) == (data, content_type)


@pytest.mark.parametrize(
    ("attrs", "expected"),
    [
        pytest.param({"delivery_mode": "1"}, (), id="transient-is-the-default"),
        pytest.param({"priority": "4"}, (), id="priority-4-is-the-default"),
        pytest.param({"priority": "04"}, (), id="priority-04"),
        pytest.param({"priority": "07"}, (("priority", "7"),), id="leading-zero"),
        pytest.param({"expiration": "0"}, (("expiration", "1"),), id="ttl-0"),
        pytest.param({"expiration": "0100"}, (("expiration", "100"),), id="ttl-leading-zero"),
    ],
)
def test_roundtrip_normalises(attrs: dict[str, str], expected: tuple[tuple[str, str], ...]) -> None:
    assert roundtrip(spec(attrs), []).props == expected


def test_foreign_roundtrip_keeps_the_amqp_value() -> None:
    for body in ({"k": [1, "v", None]}, [1, "a"], "text", 7, True, 1.25):
        first = from_amqp(wire(Message(body=body)))
        again = wire(to_amqp(first, parts_of(first)))
        assert again.body == body
        assert type(again.body) is type(body)


# Hypothesis: random properties, headers and binary bodies survive the trip.
XML_TEXT = st.text(st.characters(codec="utf-8")).filter(lambda text: not NOT_XML.search(text))
NONEMPTY = XML_TEXT.filter(bool)
RESERVED_NAMES = {"restms.type", "restms.app_id", "restms.sender_id", "restms.timestamp"}
HEADER_NAME = NONEMPTY.filter(
    lambda name: name not in RESERVED_NAMES and not name.startswith("amqp.")
)
CONTENT_TYPES = st.sampled_from(
    ["application/octet-stream", "text/plain", "application/json", "image/png", "text/x; a=b"]
)


@st.composite
def gateway_messages(draw: st.DrawFn) -> tuple[MessageSpec, Part | None]:
    attrs: dict[str, str] = {"address": draw(XML_TEXT.filter(lambda a: len(a) <= 1024))}
    for name in (
        "message_id",
        "reply_to",
        "correlation_id",
        "type",
        "user_id",
        "app_id",
        "sender_id",
    ):
        value = draw(st.none() | NONEMPTY)
        if value is not None:
            attrs[name] = value
    optional = {
        "delivery_mode": st.just("2"),
        "priority": st.sampled_from("012356789"),
        "expiration": st.integers(1, 2**32 - 1).map(str),
        "timestamp": st.integers(1, MAX_CREATION_SECONDS).map(str) | NONEMPTY,
    }
    for name, strategy in optional.items():
        if draw(st.booleans()):
            attrs[name] = draw(strategy)
    names = draw(st.lists(HEADER_NAME, unique=True, max_size=8))
    headers = [(name, draw(XML_TEXT)) for name in names]
    fields = {
        "amqp.content-encoding": NONEMPTY.filter(lambda v: v != "None"),  # unmappable
        "amqp.to": NONEMPTY,
        "amqp.group-id": NONEMPTY,
        "amqp.group-sequence": st.integers(1, 2**32 - 1).map(str),
        "amqp.reply-to-group-id": NONEMPTY,
    }
    for name, strategy in fields.items():
        if draw(st.booleans()):
            headers.append((name, draw(strategy)))
    part: Part | None = None
    if draw(st.booleans()):
        data = draw(st.binary(max_size=512))
        content_type = draw(CONTENT_TYPES)
        if draw(st.booleans()):
            part = Blob(data=data, content_type=content_type)
        else:
            value = base64.b64encode(data).decode()
            part = EmbeddedContent(type=content_type, encoding="base64", value=value)
    return spec(attrs, headers), part


@SETTINGS
@given(gateway_messages())
def test_hypothesis_gateway_roundtrip(case: tuple[MessageSpec, Part | None]) -> None:
    original, part = case
    back = roundtrip(original, [part])
    assert back.address == original.address
    assert back.props == original.props
    assert back.headers == original.headers
    if part is None:
        assert back.contents == ()
    else:
        (content,) = back.contents
        assert isinstance(content, EmbeddedContent)
        expected = part.data if isinstance(part, Blob) else part.data()
        assert content.data() == expected
        assert content.type == (part.content_type if isinstance(part, Blob) else part.type)


@SETTINGS
@given(st.binary(max_size=2048))
def test_hypothesis_binary_body_is_raw_bytes(data: bytes) -> None:
    message = wire(to_amqp(spec(), [Blob(data=data, content_type="application/octet-stream")]))
    assert (message.inferred, body_bytes(message)) == (True, data)
    (content,) = from_amqp(message).contents
    assert isinstance(content, EmbeddedContent)
    assert content.data() == data
    assert content.encoding == ("base64" if _needs_base64(data) else "plain")


def _needs_base64(data: bytes) -> bool:
    try:
        return bool(NOT_XML.search(data.decode()))
    except UnicodeDecodeError:
        return True


JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | XML_TEXT,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(XML_TEXT, children, max_size=4)
    ),
    max_leaves=12,
)


@SETTINGS
@given(JSON_VALUES.filter(lambda value: value is not None and not isinstance(value, str)))
def test_hypothesis_foreign_value_roundtrip(body: Any) -> None:
    first = from_amqp(wire(Message(body=body)))
    content = only_content(first)
    assert content.type == "application/json"
    assert first.headers == (("amqp.body", "value"),)
    assert orjson.loads(content.data()) == body
    again = wire(to_amqp(first, parts_of(first)))
    assert again.body == body
