"""The XML codec (digest §2.1, §2.3; G1-G7, L1): shapes, tolerance, hardening, escaping."""

from __future__ import annotations

import time

import pytest

from restms import NAMESPACE, BadRequest, CodecLimits, Document, Element, parse_xml, to_xml
from restms.specs import join as join_spec

IMATIX_NS = "http://www.imatix.com/schema/restms"


def xml(inner: str, ns: str | None = NAMESPACE) -> bytes:
    xmlns = f' xmlns="{ns}"' if ns is not None else ""
    return f'<?xml version="1.0"?>\n<restms{xmlns}>{inner}</restms>'.encode()


def el(
    tag: str,
    attrs: dict[str, str] | None = None,
    *children: Element,
    text: str | None = None,
) -> Element:
    return Element(tag, attrs or {}, tuple(children), text)


# ---------------------------------------------------------------- §2.3 document shapes
SHAPES = [
    pytest.param(
        """
        <domain name="default" title="Default domain">
          <profile name="3/Defaults" href="http://www.restms.org/spec:3/Defaults"/>
          <profile name="4/AMQP9" href="http://www.restms.org/spec:4/AMQP9"/>
          <feed name="default" title="Default feed" type=""
                href="http://h/restms/feed/default"/>
          <feed name="ledger" type="topic" license="MPL" href="http://h/restms/feed/ledger"/>
        </domain>
        """,
        el(
            "domain",
            {"name": "default", "title": "Default domain"},
            el("profile", {"name": "3/Defaults", "href": "http://www.restms.org/spec:3/Defaults"}),
            el("profile", {"name": "4/AMQP9", "href": "http://www.restms.org/spec:4/AMQP9"}),
            el(
                "feed",
                {
                    "name": "default",
                    "title": "Default feed",
                    "type": "",
                    "href": "http://h/restms/feed/default",
                },
            ),
            el(
                "feed",
                {
                    "name": "ledger",
                    "type": "topic",
                    "license": "MPL",
                    "href": "http://h/restms/feed/ledger",
                },
            ),
        ),
        id="domain",
    ),
    pytest.param(
        '<feed name="orders" type="fanout" title="Orders" license="none"/>',
        el("feed", {"name": "orders", "type": "fanout", "title": "Orders", "license": "none"}),
        id="feed",
    ),
    pytest.param(
        '<pipe type="" title="worker"/>',
        el("pipe", {"type": "", "title": "worker"}),
        id="pipe-new",
    ),
    pytest.param(
        """
        <pipe name="P1" type="" title="t">
          <join href="http://h/restms/resource/j1" type="" address="P1"
                feed="http://h/restms/feed/default"/>
          <message href="http://h/restms/resource/m1" address="a.b" message_id="id-1"/>
          <message href="http://h/restms/resource/m2" async="1"/>
        </pipe>
        """,
        el(
            "pipe",
            {"name": "P1", "type": "", "title": "t"},
            el(
                "join",
                {
                    "href": "http://h/restms/resource/j1",
                    "type": "",
                    "address": "P1",
                    "feed": "http://h/restms/feed/default",
                },
            ),
            el(
                "message",
                {"href": "http://h/restms/resource/m1", "address": "a.b", "message_id": "id-1"},
            ),
            el("message", {"href": "http://h/restms/resource/m2", "async": "1"}),
        ),
        id="pipe-with-joins-messages-asynclet",
    ),
    pytest.param(
        """
        <join type="" address="" feed="/restms/feed/prices">
          <header name="region" value="eu"/>
          <header name="kind" value="spot"/>
        </join>
        """,
        el(
            "join",
            {"type": "", "address": "", "feed": "/restms/feed/prices"},
            el("header", {"name": "region", "value": "eu"}),
            el("header", {"name": "kind", "value": "spot"}),
        ),
        id="join-with-headers",
    ),
    pytest.param(
        """
        <message address="billing.eu" message_id="m-7" reply_to="P1" priority="5">
          <header name="h1" value="v1"/>
          <content href="http://h/restms/resource/c1"/>
          <content type="text/plain" encoding="plain">hi &amp; bye</content>
          <content type="application/octet-stream" encoding="base64">
            AAEC
          </content>
        </message>
        """,
        el(
            "message",
            {"address": "billing.eu", "message_id": "m-7", "reply_to": "P1", "priority": "5"},
            el("header", {"name": "h1", "value": "v1"}),
            el("content", {"href": "http://h/restms/resource/c1"}),
            el("content", {"type": "text/plain", "encoding": "plain"}, text="hi & bye"),
            el(
                "content",
                {"type": "application/octet-stream", "encoding": "base64"},
                text="\n            AAEC\n          ",
            ),
        ),
        id="message-headers-linked-embedded",
    ),
    pytest.param(
        '<message count="1"/><message count="0"/>',
        [el("message", {"count": "1"}), el("message", {"count": "0"})],
        id="publish-reply",
    ),
    pytest.param("", [], id="empty-document"),
]


@pytest.mark.parametrize(("inner", "expected"), SHAPES)
def test_G1_G2_document_shapes_parse(inner: str, expected: Element | list[Element]) -> None:
    wanted = tuple(expected) if isinstance(expected, list) else (expected,)
    assert parse_xml(xml(inner)) == Document(wanted)


@pytest.mark.parametrize(("inner", "expected"), SHAPES)
def test_G5_serialised_shapes_parse_back_equal(
    inner: str, expected: Element | list[Element]
) -> None:
    document = parse_xml(xml(inner))
    assert parse_xml(to_xml(document)) == document


# ---------------------------------------------------------------- namespaces (G3, L1)
@pytest.mark.parametrize(
    "body",
    [
        pytest.param(xml('<feed name="x"/>'), id="restms.org"),
        pytest.param(xml('<feed name="x"/>', IMATIX_NS), id="imatix-L1"),
        pytest.param(xml('<feed name="x"/>', None), id="no-namespace"),
        pytest.param(xml('<feed name="x"/>', "urn:something-else"), id="other-namespace"),
        pytest.param(
            f'<r:restms xmlns:r="{NAMESPACE}"><r:feed name="x"/></r:restms>'.encode(),
            id="prefixed",
        ),
        pytest.param(
            b'<restms xmlns:q="urn:q"><feed q:name="x"/></restms>',
            id="namespaced-attribute",
        ),
    ],
)
def test_G3_any_namespace_is_matched_on_local_name(body: bytes) -> None:
    assert parse_xml(body) == Document((el("feed", {"name": "x"}),))


# ---------------------------------------------------------------- G6 and G7
def test_G6_unknown_elements_and_attributes_are_kept_by_codec() -> None:
    body = xml('<feed name="x" colour="red"><gizmo a="1"/></feed><widget/>')
    document = parse_xml(body)
    assert document == Document(
        (
            el("feed", {"name": "x", "colour": "red"}, el("gizmo", {"a": "1"})),
            el("widget"),
        )
    )


def test_G6_unknown_elements_and_attributes_are_ignored_by_specs() -> None:
    body = xml(
        '<gizmo/><join feed="/restms/feed/f" address="k" colour="red">'
        '<header name="h" value="v" extra="1"/><sprocket/></join>'
    )
    spec = join_spec(parse_xml(body))
    assert spec.feed_path == "/restms/feed/f"
    assert spec.address == "k"
    assert spec.headers == (("h", "v"),)


def test_G7_whitespace_only_text_between_elements_is_dropped() -> None:
    body = xml("\n  <pipe>\n    <join feed='/f'>\n\t</join>\n  </pipe>\n  <feed>   </feed>\n")
    document = parse_xml(body)
    pipe, feed = document.elements
    assert pipe.text is None
    assert pipe.children[0].text is None
    assert feed.text is None


def test_G7_text_on_non_content_elements_is_ignored() -> None:
    document = parse_xml(xml("<feed name='x'>stray words</feed>"))
    assert document.elements[0].text is None


def test_G7_content_keeps_its_text_including_whitespace() -> None:
    document = parse_xml(xml("<content>  two  words\n</content>"))
    assert document.elements[0].text == "  two  words\n"


def test_J5_empty_content_element_has_no_text() -> None:
    document = parse_xml(xml('<content href="/restms/resource/c"/><content></content>'))
    assert [c.text for c in document.elements] == [None, None]


def test_J6_content_text_excludes_text_of_child_elements() -> None:
    document = parse_xml(xml("<content>a<gizmo>inner</gizmo>b</content>"))
    content = document.elements[0]
    assert content.text == "ab"
    assert content.children == (el("gizmo"),)


def test_G7_comments_pis_and_cdata_in_content() -> None:
    body = xml("<content>a<!-- note -->b<?pi x?>c<![CDATA[<d> & e]]></content><!-- x -->")
    assert parse_xml(body) == Document((el("content", text="abc<d> & e"),))


# ---------------------------------------------------------------- hardening (G5)
BILLION_LAUGHS = (
    b'<?xml version="1.0"?>\n<!DOCTYPE restms [\n<!ENTITY lol "lol">\n'
    + b"".join(
        b'<!ENTITY lol%d "%s">\n' % (i, (b"&lol%d;" % (i - 1) if i > 1 else b"&lol;") * 10)
        for i in range(1, 10)
    )
    + b']>\n<restms><feed title="&lol9;"/><content>&lol9;</content></restms>'
)


def test_G5_billion_laughs_is_refused() -> None:
    with pytest.raises(BadRequest):
        parse_xml(BILLION_LAUGHS)


def test_G5_small_internal_entity_is_refused() -> None:
    body = b'<!DOCTYPE restms [<!ENTITY a "expanded">]><restms><feed title="&a;"/></restms>'
    with pytest.raises(BadRequest, match="DOCTYPE"):
        parse_xml(body)


@pytest.mark.parametrize(
    "body",
    [
        pytest.param(
            b'<?xml version="1.0"?><!DOCTYPE restms [<!ENTITY x SYSTEM "file:///etc/passwd">]>'
            b"<restms><content>&x;</content></restms>",
            id="xxe-in-text",
        ),
        pytest.param(
            b'<!DOCTYPE restms [<!ENTITY x SYSTEM "file:///etc/passwd">]>'
            b'<restms><feed title="&x;"/></restms>',
            id="xxe-in-attribute",
        ),
        pytest.param(
            b'<!DOCTYPE restms [<!ENTITY % p SYSTEM "file:///etc/passwd"> %p;]><restms/>',
            id="parameter-entity",
        ),
        pytest.param(
            b'<!DOCTYPE restms SYSTEM "file:///etc/passwd"><restms/>',
            id="external-dtd",
        ),
    ],
)
def test_G5_external_entities_are_refused_and_never_read(body: bytes) -> None:
    with pytest.raises(BadRequest) as info:
        parse_xml(body)
    assert "root:" not in str(info.value)
    assert info.value.status == 400


@pytest.mark.parametrize(
    "body",
    [
        pytest.param(b"<restms><feed></restms>", id="unclosed"),
        pytest.param(b"<restms><feed name=x/></restms>", id="unquoted-attribute"),
        pytest.param(b'<restms><feed a="1" a="2"/></restms>', id="duplicate-attribute"),
        pytest.param(b"<restms>&nosuch;</restms>", id="undefined-entity"),
        pytest.param(b"<restms/><restms/>", id="two-roots"),
        pytest.param(b"not xml at all", id="plain-text"),
        pytest.param(b'{"restms": {}}', id="json"),
        pytest.param(b"<restms>\x01</restms>", id="control-character"),
        pytest.param(b"<restms title='\xff'/>", id="invalid-utf8"),
    ],
)
def test_G5_malformed_xml_is_bad_request(body: bytes) -> None:
    with pytest.raises(BadRequest):
        parse_xml(body)


@pytest.mark.parametrize(
    "body",
    [
        b"<feed name='x'/>",
        b"<restmsx/>",
        f'<domain xmlns="{NAMESPACE}"><restms/></domain>'.encode(),
    ],
)
def test_G1_wrong_root_is_bad_request(body: bytes) -> None:
    with pytest.raises(BadRequest, match="root"):
        parse_xml(body)


@pytest.mark.parametrize("body", [b"", b"   \n\t ", b"\r\n"])
def test_C7_empty_body_is_bad_request(body: bytes) -> None:
    with pytest.raises(BadRequest, match="empty"):
        parse_xml(body)


def nested(levels: int) -> bytes:
    return xml("<feed>" * levels + "</feed>" * levels)


def test_depth_limit_allows_documents_within_it() -> None:
    limits = CodecLimits(max_depth=4)
    document = parse_xml(nested(3), limits)
    assert document.elements[0].children[0].children[0] == el("feed")


def test_depth_limit_refuses_deeper_documents() -> None:
    with pytest.raises(BadRequest, match="deeper"):
        parse_xml(nested(4), CodecLimits(max_depth=4))


def test_depth_limit_default_refuses_very_deep_documents() -> None:
    with pytest.raises(BadRequest, match="deeper"):
        parse_xml(nested(100))


def test_element_count_limit_allows_exactly_the_limit() -> None:
    document = parse_xml(
        xml("<message><header/><header/></message><feed/>"), CodecLimits(max_elements=4)
    )
    assert len(document.elements) == 2


@pytest.mark.parametrize(
    "inner",
    [
        pytest.param("<feed/>" * 5, id="flat"),
        pytest.param("<message>" + "<header/>" * 4 + "</message>", id="nested"),
    ],
)
def test_element_count_limit_refuses_more(inner: str) -> None:
    with pytest.raises(BadRequest, match="too many"):
        parse_xml(xml(inner), CodecLimits(max_elements=4))


def test_codec_limits_refuse_too_small_values() -> None:
    with pytest.raises(ValueError, match="too small"):
        CodecLimits(max_depth=2)
    with pytest.raises(ValueError, match="too small"):
        CodecLimits(max_elements=0)


# ---------------------------------------------------------------- serialising (G1, G3, G5)
def test_G3_serialiser_emits_declaration_and_restms_namespace() -> None:
    out = to_xml(Document((el("feed", {"name": "x"}),)))
    assert out.startswith(b"<?xml version=")
    assert f'<restms xmlns="{NAMESPACE}">'.encode() in out
    assert b'<feed name="x"/>' in out


def test_J8_empty_document_serialises_as_empty_root() -> None:
    out = to_xml(Document())
    assert out.rstrip().endswith(f'<restms xmlns="{NAMESPACE}"/>'.encode())
    assert parse_xml(out) == Document()


def test_G5_attribute_values_are_escaped() -> None:
    value = 'Tom & "Jerry" <cartoon> \'s'
    out = to_xml(Document((el("feed", {"title": value}),)))
    assert b"&amp;" in out
    assert b"&lt;" in out
    assert b"&quot;" in out
    assert b'"Jerry"' not in out
    assert b"<cartoon>" not in out
    assert parse_xml(out).elements[0].attrs["title"] == value


def test_G5_content_text_is_escaped() -> None:
    value = "a < b && c > d ]]> e"
    out = to_xml(Document((el("content", {"type": "text/plain"}, text=value),)))
    assert b"a &lt; b &amp;&amp; c" in out
    assert b"]]&gt;" in out
    assert parse_xml(out).elements[0].text == value


def test_G5_whitespace_in_attributes_survives_serialisation() -> None:
    value = "tab\there\nnew line\r\nend"
    out = to_xml(Document((el("feed", {"title": value}),)))
    assert parse_xml(out).elements[0].attrs["title"] == value


def test_G5_non_ascii_is_serialised_as_utf8() -> None:
    value = "caf\u00e9 \u6771\u4eac \U0001f600"
    out = to_xml(Document((el("feed", {"title": value}),)))
    assert value.encode() in out
    assert parse_xml(out).elements[0].attrs["title"] == value


def test_serialiser_keeps_child_order() -> None:
    document = Document(
        (
            el(
                "pipe",
                {"name": "p"},
                el("message", {"href": "1"}),
                el("join", {"href": "2"}),
                el("message", {"href": "3"}),
            ),
        )
    )
    assert parse_xml(to_xml(document)) == document


@pytest.mark.parametrize(
    "value", ["tab\there", "line\nbreak", "cr\rhere", "crlf\r\n", "]]>", "a&b<c>d\"e'f", ""]
)
def test_G5_serialised_values_survive_a_parse_exactly(value: str) -> None:
    """Attribute normalisation would turn tabs and newlines into spaces; we escape them."""
    document = Document(
        elements=(Element("message", {"address": value}, (Element("content", {}, (), value),)),)
    )
    (message,) = parse_xml(to_xml(document)).elements
    assert message.attrs["address"] == value
    assert message.children[0].text == (value or None)


# ---------------------------------------------------------------- attributes per element
def attributes(count: int) -> str:
    return " ".join(f'a{n}="v"' for n in range(count))


@pytest.mark.parametrize("element", ["message", "feed", "header"])
def test_attribute_limit_allows_exactly_the_limit(element: str) -> None:
    document = parse_xml(xml(f"<{element} {attributes(3)}/>"), CodecLimits(max_attributes=3))
    assert document.elements[0].attrs == {"a0": "v", "a1": "v", "a2": "v"}


@pytest.mark.parametrize(
    "inner",
    [
        pytest.param(f"<feed {attributes(4)}/>", id="top"),
        pytest.param(f'<message><header name="h" {attributes(3)}/></message>', id="nested"),
    ],
)
def test_attribute_limit_refuses_more_naming_the_element(inner: str) -> None:
    element = "feed" if inner.startswith("<feed") else "header"
    with pytest.raises(BadRequest, match=f"<{element}> has more than 3 attributes"):
        parse_xml(xml(inner), CodecLimits(max_attributes=3))


def test_attribute_limit_counts_the_root_too() -> None:
    body = f'<restms xmlns="{NAMESPACE}" {attributes(4)}/>'.encode()
    with pytest.raises(BadRequest, match="<restms> has more than 3 attributes"):
        parse_xml(body, CodecLimits(max_attributes=3))


def test_many_attributes_are_refused_before_they_are_read() -> None:
    # 40,000 attributes took 1.7 s to read one by one (quadratic); counting them is one
    # walk. Timed against a document of the same size with none, on the same machine.
    many = xml(f"<message {attributes(40_000)}/>")
    plain = xml("<message>" + "<gadg/>" * (len(many) // 7 - 20) + "</message>")
    with pytest.raises(BadRequest, match="more than 64 attributes"):
        parse_xml(many)
    started = time.process_time()
    with pytest.raises(BadRequest, match="more than 64 attributes"):
        parse_xml(many)
    took = time.process_time() - started
    started = time.process_time()
    parse_xml(plain, CodecLimits(max_elements=len(plain)))
    assert took < 0.1 + 2 * (time.process_time() - started)


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b"<restms><feed", "Couldn't find end of Start Tag feed at line 1, column 14"),
        (
            b"<restms>\n<a>\n",
            "Premature end of data in tag a (begun on line 2) at line 3, column 1",
        ),
        (b"<restms>&xxe;</restms>", "Entity 'xxe' not defined at line 1, column 14"),
    ],
)
def test_a_syntax_error_names_its_line_once(body: bytes, reason: str) -> None:
    with pytest.raises(BadRequest) as refused:
        parse_xml(body)
    assert refused.value.reason == "malformed XML: " + reason
