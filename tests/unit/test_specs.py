"""Typed specs read out of documents (digest §1.3, §2.3, §5, §6.6).

Documents are built with the XML codec so each case reads like what a client sends.
"""

from __future__ import annotations

import base64
import json

import pytest

from restms import BadRequest, Document, Element, PayloadTooLarge, parse_xml
from restms.specs import (
    DEFAULT_CONTENT_TYPE,
    MESSAGE_PROPERTIES,
    EmbeddedContent,
    FeedSpec,
    JoinSpec,
    LinkedContent,
    MessageLimits,
    MessageSpec,
    PipeSpec,
    Update,
    creation,
    join,
    messages,
    update,
)

LIMITS = MessageLimits()


def xml(inner: str) -> Document:
    return parse_xml(
        f'<restms xmlns="http://www.restms.org/schema/restms">{inner}</restms>'.encode()
    )


def one_message(attrs: str = "", inner: str = "") -> MessageSpec:
    (spec,) = messages(xml(f"<message {attrs}>{inner}</message>"), LIMITS)
    return spec


# ---------------------------------------------------------------- creation (C1-C10)
@pytest.mark.parametrize(
    ("inner", "expected"),
    [
        pytest.param(
            '<feed name="orders" type="topic" title="Orders" license="MPL"/>',
            FeedSpec(name="orders", type="topic", title="Orders", license="MPL"),
            id="public-feed",
        ),
        pytest.param("<feed/>", FeedSpec(name=None), id="private-feed"),
        pytest.param('<feed type="rotator"/>', FeedSpec(name=None, type="rotator"), id="rotator"),
        pytest.param('<pipe type="" title="w"/>', PipeSpec(type="", title="w"), id="pipe"),
        pytest.param('<pipe type="ondemand"/>', PipeSpec(type="ondemand"), id="ondemand"),
        pytest.param("<pipe/>", PipeSpec(), id="bare-pipe"),
    ],
)
def test_C1_creation_reads_feed_and_pipe_specs(inner: str, expected: object) -> None:
    assert creation(xml(inner)) == expected


@pytest.mark.parametrize(
    "inner",
    [
        pytest.param('<feed type="bogus"/>', id="feed"),
        pytest.param('<feed type="TOPIC"/>', id="feed-case-sensitive"),
        pytest.param('<feed type="fifo"/>', id="fifo-is-a-pipe-alias-only"),
        pytest.param('<pipe type="bogus"/>', id="pipe"),
        pytest.param('<pipe type="topic"/>', id="pipe-with-feed-type"),
    ],
)
def test_C6_unknown_types_are_bad_request(inner: str) -> None:
    with pytest.raises(BadRequest, match="unknown"):
        creation(xml(inner))


@pytest.mark.parametrize(
    "inner",
    [
        pytest.param("", id="empty"),
        pytest.param("<gizmo/>", id="only-unknown-elements"),
        pytest.param("<feed/><feed/>", id="two-feeds"),
        pytest.param("<feed/><pipe/>", id="feed-and-pipe"),
        pytest.param('<join feed="/restms/feed/default"/>', id="join-on-domain"),
        pytest.param("<message/>", id="message-on-domain"),
        pytest.param("<domain/>", id="domain"),
    ],
)
def test_C7_zero_several_or_wrong_resource_elements_are_bad_request(inner: str) -> None:
    with pytest.raises(BadRequest):
        creation(xml(inner))


def test_G6_unknown_elements_beside_the_resource_are_ignored() -> None:
    document = xml('<gizmo/><feed name="f" colour="red"><sprocket/></feed><header name="x"/>')
    assert creation(document) == FeedSpec(name="f")


def test_C8_empty_attributes_count_as_absent() -> None:
    spec = creation(xml('<feed name="" type="" title="" license=""/>'))
    assert spec == FeedSpec(name=None, type="", title=None, license=None)
    assert creation(xml('<pipe type="" title=""/>')) == PipeSpec(type="", title=None)


def test_C9_pipe_name_is_ignored() -> None:
    spec = creation(xml('<pipe name="stale-cached-name" title="w"/>'), slug="slugged")
    assert spec == PipeSpec(type="", title="w")


def test_C10_slug_names_the_feed_when_the_document_does_not() -> None:
    assert creation(xml('<feed type="fanout"/>'), slug="orders") == FeedSpec(
        name="orders", type="fanout"
    )
    assert creation(xml('<feed name=""/>'), slug=" orders ") == FeedSpec(name="orders")


def test_C10_document_name_wins_over_slug() -> None:
    assert creation(xml('<feed name="doc"/>'), slug="slug") == FeedSpec(name="doc")


@pytest.mark.parametrize("slug", [None, "", "   "])
def test_C10_absent_or_blank_slug_gives_private_feed(slug: str | None) -> None:
    assert creation(xml("<feed/>"), slug=slug) == FeedSpec(name=None)


@pytest.mark.parametrize(("alias", "expected"), [("fifo", ""), ("", ""), ("stream", "stream")])
def test_P2_fifo_is_an_alias_of_the_default_pipe_type(alias: str, expected: str) -> None:
    spec = creation(xml(f'<pipe type="{alias}"/>'))
    assert spec == PipeSpec(type=expected)


# ---------------------------------------------------------------- names (U7)
@pytest.mark.parametrize("name", ["a/b", "a b", "a@b", "tab\there", "nl\n", ".", ".."])
def test_U7_bad_feed_names_are_bad_request(name: str) -> None:
    with pytest.raises(BadRequest):
        creation(xml(f'<feed name="{name}"/>'))


@pytest.mark.parametrize("name", ["a/b", "a b", "a@b"])
def test_U7_bad_slug_names_are_bad_request(name: str) -> None:
    with pytest.raises(BadRequest):
        creation(xml("<feed/>"), slug=name)


def test_U7_overlong_feed_name_is_bad_request() -> None:
    with pytest.raises(BadRequest, match="longer"):
        FeedSpec(name="n" * 201)


@pytest.mark.parametrize("name", ["orders", "a.b-c_d", "caf\u00e9", "x" * 200, "a#b*"])
def test_U7_good_feed_names_are_kept(name: str) -> None:
    assert creation(xml(f'<feed name="{name}"/>')) == FeedSpec(name=name)


# ---------------------------------------------------------------- joins (G14, F9, U5)
def test_G14_join_reads_feed_address_and_headers() -> None:
    spec = join(
        xml(
            '<join type="" address="billing.#" feed="http://h/restms/feed/ledger">'
            '<header name="region" value="eu"/><header name="kind"/></join>'
        )
    )
    assert spec == JoinSpec(
        feed_path="/restms/feed/ledger",
        address="billing.#",
        type="",
        headers=(("region", "eu"), ("kind", "")),
    )


def test_G14_join_address_defaults_to_empty() -> None:
    assert join(xml('<join feed="/restms/feed/default"/>')).address == ""


@pytest.mark.parametrize(
    "inner",
    [
        pytest.param('<join address="x"/>', id="missing"),
        pytest.param('<join feed="" address="x"/>', id="empty"),
    ],
)
def test_G14_join_without_feed_is_bad_request(inner: str) -> None:
    with pytest.raises(BadRequest, match="feed"):
        join(xml(inner))


@pytest.mark.parametrize(
    "feed",
    [
        "/restms/feed/ledger",
        "http://localhost/restms/feed/ledger",
        "http://127.0.0.1:8080/restms/feed/ledger",
        "https://mq.example.net:443/restms/feed/ledger?ignored=1#frag",
    ],
)
def test_U5_absolute_and_path_only_feed_uris_give_the_same_path(feed: str) -> None:
    assert join(xml(f'<join feed="{feed}"/>')).feed_path == "/restms/feed/ledger"


def test_U5_feed_uri_path_is_percent_decoded() -> None:
    assert join(xml('<join feed="/restms/feed/caf%C3%A9"/>')).feed_path == "/restms/feed/caf\u00e9"


@pytest.mark.parametrize("kind", ["topic", "x", "fifo", "*"])
def test_F9_join_type_other_than_default_is_bad_request(kind: str) -> None:
    with pytest.raises(BadRequest, match="join type"):
        join(xml(f'<join type="{kind}" feed="/restms/feed/f"/>'))


@pytest.mark.parametrize(
    "inner",
    [
        pytest.param("", id="none"),
        pytest.param('<join feed="/a"/><join feed="/b"/>', id="two"),
        pytest.param("<feed/>", id="feed-on-pipe"),
        pytest.param("<pipe/>", id="pipe-on-pipe"),
    ],
)
def test_C7_join_document_needs_exactly_one_join(inner: str) -> None:
    with pytest.raises(BadRequest):
        join(xml(inner))


def test_G14_join_header_without_name_is_bad_request() -> None:
    with pytest.raises(BadRequest, match="name"):
        join(xml('<join feed="/restms/feed/f"><header value="v"/></join>'))


def test_F10_join_identity_ignores_header_order() -> None:
    a = join(xml('<join feed="/f"><header name="a" value="1"/><header name="b" value="2"/></join>'))
    b = join(xml('<join feed="/f"><header name="b" value="2"/><header name="a" value="1"/></join>'))
    c = join(xml('<join feed="/f" address="k"><header name="a" value="1"/></join>'))
    assert a.identity == b.identity
    assert a.identity != c.identity


# ---------------------------------------------------------------- updates (R2, R3)
def test_R2_update_carries_the_properties_sent() -> None:
    spec = update(xml('<feed title="New" license="L"/>'), "feed")
    assert spec == Update(name=None, type=None, title="New", license="L")


def test_R3_update_keeps_empty_name_and_type_distinct_from_absent() -> None:
    spec = update(xml('<feed name="" type="" title="t"/>'), "feed")
    assert spec == Update(name="", type="", title="t", license=None)


def test_R2_pipe_update() -> None:
    assert update(xml('<pipe title="renamed"/>'), "pipe") == Update(title="renamed")


@pytest.mark.parametrize("inner", ["", "<pipe/>", "<feed/><feed/>"])
def test_R2_update_of_wrong_or_missing_element_is_bad_request(inner: str) -> None:
    with pytest.raises(BadRequest):
        update(xml(inner), "feed")


# ---------------------------------------------------------------- messages (M5, M12, §6.6)
def test_M5_messages_are_read_in_order() -> None:
    specs = messages(
        xml('<message address="a"/><gizmo/><message address="b"/><message/>'),
        LIMITS,
    )
    assert [m.address for m in specs] == ["a", "b", ""]


@pytest.mark.parametrize("inner", ["", "<feed/>", "<gizmo><message/></gizmo>"])
def test_M12_document_without_message_is_bad_request(inner: str) -> None:
    with pytest.raises(BadRequest, match="message"):
        messages(xml(inner), LIMITS)


def test_AMQP9_properties_are_kept_in_canonical_order() -> None:
    attrs = " ".join(f'{name}="{name}-v"' for name in reversed(MESSAGE_PROPERTIES))
    attrs = attrs.replace('delivery_mode="delivery_mode-v"', 'delivery_mode="2"')
    attrs = attrs.replace('priority="priority-v"', 'priority="7"')
    attrs = attrs.replace('expiration="expiration-v"', 'expiration="60000"')
    spec = one_message(f'address="a.b" {attrs} colour="red"')
    assert [key for key, _ in spec.props] == list(MESSAGE_PROPERTIES)
    assert spec.prop("priority") == "7"
    assert spec.prop("delivery_mode") == "2"
    assert spec.prop("reply_to") == "reply_to-v"
    assert spec.address == "a.b"


def test_M13_unknown_and_empty_properties_are_dropped() -> None:
    spec = one_message('message_id="" colour="red" reply_to="P1"')
    assert spec.props == (("reply_to", "P1"),)
    assert spec.prop("message_id") is None
    assert spec.prop("colour") is None


@pytest.mark.parametrize("value", ["0", "5", "9"])
def test_AMQP9_priority_in_range_is_accepted(value: str) -> None:
    assert one_message(f'priority="{value}"').prop("priority") == value


@pytest.mark.parametrize("value", ["10", "-1", "a", "5.0", " 5", "\u0665", "+3"])
def test_AMQP9_priority_outside_0_to_9_is_bad_request(value: str) -> None:
    with pytest.raises(BadRequest, match="priority"):
        one_message(f'priority="{value}"')


@pytest.mark.parametrize("value", ["1", "2"])
def test_AMQP9_delivery_mode_1_or_2_is_accepted(value: str) -> None:
    assert one_message(f'delivery_mode="{value}"').prop("delivery_mode") == value


@pytest.mark.parametrize("value", ["0", "3", "persistent", "02x"])
def test_AMQP9_delivery_mode_other_than_1_or_2_is_bad_request(value: str) -> None:
    with pytest.raises(BadRequest, match="delivery_mode"):
        one_message(f'delivery_mode="{value}"')


@pytest.mark.parametrize("value", ["0", "60000", "4294967295"])
def test_AMQP9_expiration_digits_are_accepted(value: str) -> None:
    assert one_message(f'expiration="{value}"').prop("expiration") == value


@pytest.mark.parametrize("value", ["-1", "1.5", "1e3", "soon", "\u0661\u0662"])
def test_AMQP9_expiration_not_digits_is_bad_request(value: str) -> None:
    with pytest.raises(BadRequest, match="expiration"):
        one_message(f'expiration="{value}"')


@pytest.mark.parametrize("value", ["4294967296", "99999999999999999999"])
def test_AMQP9_expiration_over_uint32_milliseconds_is_bad_request(value: str) -> None:
    with pytest.raises(BadRequest, match="expiration"):
        one_message(f'expiration="{value}"')


def test_M5_headers_are_kept_in_order() -> None:
    spec = one_message(
        inner='<header name="b" value="2"/><header name="a" value="1"/><header name="c"/>'
    )
    assert spec.headers == (("b", "2"), ("a", "1"), ("c", ""))
    assert spec.header_map == {"a": "1", "b": "2", "c": ""}


def test_M5_header_without_name_is_bad_request() -> None:
    with pytest.raises(BadRequest, match="name"):
        one_message(inner='<header name="" value="v"/>')


def test_M5_address_too_long_is_bad_request() -> None:
    with pytest.raises(BadRequest, match="address"):
        one_message(f'address="{"a" * 1025}"')


# ---------------------------------------------------------------- contents (M1, M6)
def test_M5_linked_and_embedded_contents_in_order() -> None:
    spec = one_message(
        inner='<content href="http://h:80/restms/resource/c1" type="ignored"/>'
        "<content>plain text</content>"
        '<content href="/restms/resource/c2"/>'
    )
    assert spec.contents == (
        LinkedContent(path="/restms/resource/c1"),
        EmbeddedContent(type="text/plain", encoding="plain", value="plain text"),
        LinkedContent(path="/restms/resource/c2"),
    )


def test_M6_embedded_content_defaults_to_text_plain_and_plain_encoding() -> None:
    (content,) = one_message(inner='<content type="" encoding="">hi &amp; bye</content>').contents
    assert content == EmbeddedContent(type=DEFAULT_CONTENT_TYPE, encoding="plain", value="hi & bye")
    assert DEFAULT_CONTENT_TYPE == "text/plain"
    assert content.data() == b"hi & bye"


def test_M6_empty_embedded_content_has_empty_data() -> None:
    (content,) = one_message(inner="<content/>").contents
    assert content == EmbeddedContent(value="")
    assert content.data() == b""


def test_M6_plain_text_is_utf8_encoded() -> None:
    (content,) = one_message(inner="<content>caf\u00e9</content>").contents
    assert content.data() == "caf\u00e9".encode()


def test_M6_base64_with_line_breaks_and_indentation_is_accepted() -> None:
    payload = bytes(range(256)) * 2
    folded = base64.encodebytes(payload).decode()  # 76-column lines
    indented = "\n".join("      " + line for line in folded.splitlines())
    (content,) = one_message(
        inner=f'<content type="application/octet-stream" encoding="base64">\n{indented}\n  '
        "</content>"
    ).contents
    assert " " not in content.value
    assert "\n" not in content.value
    assert content.type == "application/octet-stream"
    assert content.data() == payload


@pytest.mark.parametrize(
    "value",
    [
        pytest.param("not base64!", id="bad-characters"),
        pytest.param("aGVsbG8", id="missing-padding"),
        pytest.param("a", id="one-character"),
        pytest.param("aGVs=bG8=", id="padding-in-the-middle"),
    ],
)
def test_M6_invalid_base64_is_bad_request(value: str) -> None:
    with pytest.raises(BadRequest, match="base64"):
        one_message(inner=f'<content encoding="base64">{value}</content>')


@pytest.mark.parametrize("encoding", ["gzip", "BASE64", "quoted-printable", "utf-8"])
def test_M6_unknown_encoding_is_bad_request(encoding: str) -> None:
    with pytest.raises(BadRequest, match="encoding"):
        one_message(inner=f'<content encoding="{encoding}">x</content>')


def test_M6_embedded_content_validates_when_built() -> None:
    with pytest.raises(BadRequest, match="encoding"):
        EmbeddedContent(encoding="zip")


@pytest.mark.parametrize("code", range(0x20))
def test_M6_raw_bytes_with_a_control_xml_cannot_carry_become_base64(code: int) -> None:
    data = b"text " + bytes([code]) + b" more"
    content = EmbeddedContent.of(data, "text/plain")
    assert content.encoding == ("plain" if code in b"\t\n\r" else "base64")
    assert content.data() == data


# ---------------------------------------------------------------- limits (M5 caps, 413)
def test_M5_too_many_messages_is_payload_too_large() -> None:
    limits = MessageLimits(max_messages=2)
    assert len(messages(xml("<message/>" * 2), limits)) == 2
    with pytest.raises(PayloadTooLarge):
        messages(xml("<message/>" * 3), limits)


def test_M5_too_many_headers_is_payload_too_large() -> None:
    limits = MessageLimits(max_headers=2)
    header = '<header name="h" value="v"/>'
    assert len(messages(xml(f"<message>{header * 2}</message>"), limits)[0].headers) == 2
    with pytest.raises(PayloadTooLarge):
        messages(xml(f"<message>{header * 3}</message>"), limits)


def test_M5_too_many_contents_is_payload_too_large() -> None:
    limits = MessageLimits(max_contents=1)
    assert len(messages(xml("<message><content/></message>"), limits)[0].contents) == 1
    with pytest.raises(PayloadTooLarge):
        messages(xml("<message><content/><content>x</content></message>"), limits)


@pytest.mark.parametrize("fmt", ["xml", "json"])
@pytest.mark.parametrize("path", ["direct", "generic"])
def test_one_headers_size_is_bounded_and_every_path_weighs_the_head_alike(
    fmt: str, path: str
) -> None:
    """max_header_bytes bounds one header's name and value (413 naming it), on the
    scanner's and JSON's direct paths and the generic one; each weighs a message's
    address, properties and headers as MessageSpec itself does."""
    from restms import Format, decode, fastpath
    from restms.xmlcodec import CodecLimits

    limits, codec = MessageLimits(max_header_bytes=20), CodecLimits()
    kind = Format.XML if fmt == "xml" else Format.JSON

    def read(value: str) -> tuple[MessageSpec, ...]:
        attrs = {"address": "a.b", "message_id": "m1"}
        headers = [{"name": "h", "value": "v"}, {"name": "x-big", "value": value}]
        if fmt == "json":
            message = {**attrs, "header": headers, "content": [{"value": "body"}]}
            body = json.dumps({"restms": {"message": [message]}}).encode()
        else:
            head = " ".join(f'{k}="{v}"' for k, v in attrs.items())
            tags = "".join(f'<header name="{h["name"]}" value="{h["value"]}"/>' for h in headers)
            body = f"<restms><message {head}>{tags}<content>body</content></message></restms>"
            body = body.encode()
        if path == "direct":
            found = fastpath.direct(body, kind, codec, limits)
            assert found is not None  # the plain shape: not left to the generic path
            return found
        return messages(decode(body, kind, codec), limits)

    (spec,) = read("v" * 15)  # 5 + 15: at the bound
    assert spec.head_size == sum(map(len, ("a.b", "message_id", "m1", "h", "v", "x-big"))) + 15
    assert (
        spec.head_size
        == MessageSpec(address=spec.address, props=spec.props, headers=spec.headers).head_size
    )
    with pytest.raises(PayloadTooLarge) as info:
        read("v" * 16)
    assert "'x-big'" in info.value.reason
    assert "20" in info.value.reason


def test_M5_limit_errors_are_413() -> None:
    with pytest.raises(PayloadTooLarge) as info:
        messages(xml("<message/>" * 2), MessageLimits(max_messages=1))
    assert info.value.status == 413


def test_specs_work_on_documents_built_directly() -> None:
    document = Document((Element("feed", {"name": "direct", "type": "direct"}),))
    assert creation(document) == FeedSpec(name="direct", type="direct")
