"""Media types, negotiation and sniffing (digest §2.2, G8-G12, M3) and ETags/dates (§3)."""

from __future__ import annotations

import pytest

from restms import Format, NotAcceptable, body_format, negotiate
from restms.httpdates import etag, etag_list, http_date, parse_http_date
from restms.media import accepts_event_stream, bare_type, looks_structured

BROWSER = "text/html,application/xhtml+xml,application/xml;q=0.9,image/avif,*/*;q=0.8"


# ---------------------------------------------------------------- negotiate (G9, G12)
@pytest.mark.parametrize("accept", [None, "", "   "])
def test_G9_no_accept_gives_xml(accept: str | None) -> None:
    assert negotiate(accept) is Format.XML


@pytest.mark.parametrize("fallback", list(Format))
def test_G12_no_accept_mirrors_the_request_format(fallback: Format) -> None:
    assert negotiate(None, fallback) is fallback
    assert negotiate("", fallback) is fallback


@pytest.mark.parametrize(
    ("accept", "expected"),
    [
        pytest.param("application/restms+xml", Format.XML, id="restms-xml"),
        pytest.param("application/restms+json", Format.JSON, id="restms-json"),
        pytest.param("application/json", Format.JSON, id="json"),
        pytest.param("application/xml", Format.XML, id="xml"),
        pytest.param("text/xml", Format.TEXT_XML, id="text-xml"),
        pytest.param("Application/RestMS+JSON", Format.JSON, id="case-insensitive"),
        pytest.param("application/restms+json; charset=utf-8", Format.JSON, id="parameters"),
        pytest.param("*/*", Format.XML, id="wildcard"),
        pytest.param("application/*", Format.XML, id="application-wildcard"),
        pytest.param("text/*", Format.TEXT_XML, id="text-wildcard"),
        pytest.param(BROWSER, Format.XML, id="browser"),
        pytest.param("text/html, */*", Format.XML, id="html-then-wildcard"),
        pytest.param(
            "application/restms+xml;q=0.5, application/restms+json;q=0.9",
            Format.JSON,
            id="json-highest-q",
        ),
        pytest.param(
            "application/restms+json;q=0.5, application/restms+xml",
            Format.XML,
            id="xml-highest-q",
        ),
        pytest.param("application/restms+json, */*;q=0.1", Format.JSON, id="json-then-wildcard"),
        pytest.param("*/*;q=0.1, application/restms+json", Format.JSON, id="json-after-wildcard"),
        pytest.param(
            "application/restms+json;q=0.8, application/restms+xml;q=0.8",
            Format.JSON,
            id="tie-keeps-listed-order",
        ),
        pytest.param("image/png, application/json;q=0.2", Format.JSON, id="unsupported-first"),
    ],
)
def test_G9_negotiate(accept: str, expected: Format) -> None:
    assert negotiate(accept) is expected


@pytest.mark.parametrize(
    ("accept", "expected"),
    [
        pytest.param("application/restms+json;q=0, */*", Format.XML, id="json-refused"),
        pytest.param("application/restms+json;q=0.0, text/xml", Format.TEXT_XML, id="q-0.0"),
        pytest.param("*/*;q=0, application/json;q=0.1", Format.JSON, id="wildcard-refused"),
        pytest.param("application/json;q=bogus, text/xml", Format.TEXT_XML, id="bad-q"),
    ],
)
def test_G9_q_zero_is_excluded(accept: str, expected: Format) -> None:
    assert negotiate(accept) is expected


@pytest.mark.parametrize(
    "accept",
    [
        "image/png",
        "text/html, text/plain;q=0.5",
        "application/restms+json;q=0",
        "*/*;q=0",
        "application/restms+xml;q=0, text/xml;q=0",
        ",,,",
    ],
)
def test_G11_only_unsupported_types_is_not_acceptable(accept: str) -> None:
    with pytest.raises(NotAcceptable) as info:
        negotiate(accept)
    assert info.value.status == 406


def test_G12_wildcard_mirrors_the_request_format() -> None:
    assert negotiate("*/*", Format.JSON) is Format.JSON
    assert negotiate("application/*", Format.TEXT_XML) is Format.TEXT_XML


def test_G9_explicit_type_beats_the_request_format() -> None:
    assert negotiate("application/restms+xml", Format.JSON) is Format.XML
    assert negotiate("text/xml", Format.JSON) is Format.TEXT_XML
    assert negotiate(BROWSER, Format.JSON) is Format.XML


def test_G8_formats_carry_their_media_types() -> None:
    assert Format.XML.media_type == "application/restms+xml"
    assert Format.JSON.media_type == "application/restms+json"
    assert Format.TEXT_XML.media_type == "text/xml"
    assert [f for f in Format if f.is_json] == [Format.JSON]


# ---------------------------------------------------------------- body_format (G8, G10)
@pytest.mark.parametrize(
    ("content_type", "expected"),
    [
        pytest.param("application/restms+xml", Format.XML, id="restms-xml"),
        pytest.param("application/restms+json", Format.JSON, id="restms-json"),
        pytest.param("text/xml", Format.TEXT_XML, id="text-xml"),
        pytest.param("application/xml", Format.XML, id="G10-xml"),
        pytest.param("application/json", Format.JSON, id="G10-json"),
        pytest.param("application/restms+xml; charset=utf-8", Format.XML, id="charset"),
        pytest.param("text/xml;charset=UTF-8", Format.TEXT_XML, id="charset-no-space"),
        pytest.param(" Application/JSON ; charset=utf-8", Format.JSON, id="case-and-spaces"),
        pytest.param("text/plain", None, id="text-plain"),
        pytest.param("application/octet-stream", None, id="octet-stream"),
        pytest.param("image/png; q=1", None, id="image"),
        pytest.param("application/restms+xmlx", None, id="near-miss"),
        pytest.param("", None, id="empty"),
        pytest.param(None, None, id="absent"),
    ],
)
def test_G10_body_format(content_type: str | None, expected: Format | None) -> None:
    assert body_format(content_type) is expected


def test_G10_bare_type_strips_parameters() -> None:
    assert bare_type("Text/XML; charset=utf-8; x=y") == "text/xml"
    assert bare_type(None) == ""


# ---------------------------------------------------------------- sniffing (M3)
@pytest.mark.parametrize(
    ("body", "expected"),
    [
        pytest.param(b'<?xml version="1.0"?><restms/>', Format.XML, id="declaration"),
        pytest.param(b"<restms><message/></restms>", Format.XML, id="restms-root"),
        pytest.param(b"\n\t  <restms/>", Format.XML, id="leading-whitespace"),
        pytest.param(b'{"restms":{"message":[{}]}}', Format.JSON, id="json"),
        pytest.param(b' \r\n{ "restms" : {} }', Format.JSON, id="json-whitespace"),
        pytest.param(b"hello world", None, id="text"),
        pytest.param(b"", None, id="empty"),
        pytest.param(b"<html><body/></html>", None, id="html"),
        pytest.param(b"<feed/>", None, id="other-xml"),
        pytest.param(b'{"other": 1}', None, id="json-without-restms"),
        pytest.param(b'["restms"]', None, id="json-array"),
        pytest.param(b"\x89PNG\r\n\x1a\n", None, id="binary"),
        pytest.param(b"x <restms/>", None, id="restms-not-first"),
    ],
)
def test_M3_looks_structured(body: bytes, expected: Format | None) -> None:
    assert looks_structured(body) is expected


# ---------------------------------------------------------------- event streams
@pytest.mark.parametrize(
    ("accept", "expected"),
    [
        ("text/event-stream", True),
        ("text/event-stream, application/restms+xml;q=0.5", True),
        ("application/restms+xml, text/event-stream;q=0.5", False),
        ("text/event-stream;q=0", False),
        ("application/restms+xml", False),
        (None, False),
    ],
)
def test_event_stream_must_be_first_choice(accept: str | None, expected: bool) -> None:
    assert accepts_event_stream(accept) is expected


# ---------------------------------------------------------------- dates (H2)
RFC1123 = "Sun, 06 Nov 1994 08:49:37 GMT"
EPOCH_1994 = 784111777


def test_H2_http_date_is_rfc1123_gmt() -> None:
    assert http_date(EPOCH_1994) == RFC1123


def test_H2_http_date_has_one_second_resolution() -> None:
    assert http_date(EPOCH_1994 + 0.999) == RFC1123


@pytest.mark.parametrize(
    "value",
    [
        pytest.param(RFC1123, id="GMT"),
        pytest.param("Sun, 06 Nov 1994 08:49:37 UTC", id="UTC"),
        pytest.param("  Sun, 06 Nov 1994 08:49:37 GMT  ", id="padded"),
        pytest.param("Sun, 06 Nov 1994 09:49:37 +0100", id="offset"),
        pytest.param("Sunday, 06-Nov-94 08:49:37 GMT", id="rfc850"),
        pytest.param("Sun Nov  6 08:49:37 1994", id="asctime"),
    ],
)
def test_H2_parse_http_date(value: str) -> None:
    assert parse_http_date(value) == EPOCH_1994


@pytest.mark.parametrize("value", [None, "", "yesterday", "Sun, 99 Nov 1994 08:49:37 GMT"])
def test_H2_unreadable_dates_are_none(value: str | None) -> None:
    assert parse_http_date(value) is None


def test_H2_http_date_round_trips() -> None:
    for stamp in (0, EPOCH_1994, 2_000_000_000):
        assert parse_http_date(http_date(stamp)) == stamp


# ---------------------------------------------------------------- ETags (H6, G15)
def test_H6_etag_differs_per_format() -> None:
    tags = {etag("/restms/feed/x", 3, fmt.tag) for fmt in Format}
    assert len(tags) == len(Format) == 3


def test_H6_etag_differs_per_version_and_resource() -> None:
    assert etag("/restms/feed/x", 3, "x") != etag("/restms/feed/x", 4, "x")
    assert etag("/restms/feed/x", 3, "x") != etag("/restms/feed/y", 3, "x")


def test_H6_etag_is_stable_and_quoted() -> None:
    tag = etag("/restms/feed/x", 3, "x")
    assert tag == etag("/restms/feed/x", 3, "x")
    assert tag.startswith('"')
    assert tag.endswith('"')
    assert '"' not in tag[1:-1]


def test_H3_etag_list_parses_strong_weak_and_star() -> None:
    assert etag_list('"a", W/"b" ,"c"') == ['"a"', '"b"', '"c"']
    assert etag_list("*") == ["*"]
    assert etag_list(None) == []
    assert etag_list("") == []


@pytest.mark.parametrize(
    "body", [b'{"name":"restms"}', b'[{"restms": 1}]', b'{"a": {"restms": {}}}']
)
def test_M3_json_that_is_not_a_restms_document_is_staged_not_parsed(body: bytes) -> None:
    assert looks_structured(body) is None
