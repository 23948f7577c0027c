"""The JSON mapping (digest §2.4, J1-J8), including the §2.3 worked example."""

from __future__ import annotations

import json

import orjson
import pytest

from restms import (
    BadRequest,
    CodecLimits,
    Document,
    Element,
    parse_json,
    parse_xml,
    to_json,
    to_xml,
)

WORKED_XML = b"""<?xml version="1.0"?>
<restms xmlns="http://www.restms.org/schema/restms">
  <pipe name="Kq7Vx2Rb" type="" title="invoice worker">
    <join href="http://mq.example.net/restms/resource/jA41" type=""
          address="Kq7Vx2Rb" feed="http://mq.example.net/restms/feed/default"/>
    <join href="http://mq.example.net/restms/resource/jA57" type=""
          address="billing.eu.#" feed="http://mq.example.net/restms/feed/ledger"/>
    <message href="http://mq.example.net/restms/resource/mB9-17"
             address="billing.eu.invoice" message_id="inv-2231"/>
    <message href="http://mq.example.net/restms/resource/mB9-18" async="1"/>
  </pipe>
</restms>
"""

WORKED_JSON = b"""{"restms": {
  "pipe": [ {
    "name": "Kq7Vx2Rb", "type": "", "title": "invoice worker",
    "join": [
      {"href": "http://mq.example.net/restms/resource/jA41", "type": "",
       "address": "Kq7Vx2Rb", "feed": "http://mq.example.net/restms/feed/default"},
      {"href": "http://mq.example.net/restms/resource/jA57", "type": "",
       "address": "billing.eu.#", "feed": "http://mq.example.net/restms/feed/ledger"}
    ],
    "message": [
      {"href": "http://mq.example.net/restms/resource/mB9-17",
       "address": "billing.eu.invoice", "message_id": "inv-2231"},
      {"href": "http://mq.example.net/restms/resource/mB9-18", "async": "1"}
    ]
  } ]
}}
"""


def el(
    tag: str,
    attrs: dict[str, str] | None = None,
    *children: Element,
    text: str | None = None,
) -> Element:
    return Element(tag, attrs or {}, tuple(children), text)


def doc(body: object) -> bytes:
    return json.dumps(body).encode()


# ---------------------------------------------------------------- worked example
def test_J6_worked_example_xml_and_json_decode_to_equal_documents() -> None:
    from_xml = parse_xml(WORKED_XML)
    from_json = parse_json(WORKED_JSON)
    assert from_xml == from_json
    pipe = from_json.elements[0]
    assert [c.tag for c in pipe.children] == ["join", "join", "message", "message"]
    assert pipe.children[3].attrs == {
        "href": "http://mq.example.net/restms/resource/mB9-18",
        "async": "1",
    }


def test_J1_J2_worked_example_encodes_to_the_json_form() -> None:
    assert orjson.loads(to_json(parse_xml(WORKED_XML))) == orjson.loads(WORKED_JSON)


def test_J5_embedded_content_example() -> None:
    body = (
        b"<restms><message><content type='text/plain' encoding='plain'>hi &amp; bye"
        b"</content></message></restms>"
    )
    out = orjson.loads(to_json(parse_xml(body)))
    assert out == {
        "restms": {
            "message": [
                {"content": [{"type": "text/plain", "encoding": "plain", "value": "hi & bye"}]}
            ]
        }
    }


# ---------------------------------------------------------------- J1-J5 encoding
def test_J1_single_schema_key() -> None:
    out = orjson.loads(to_json(Document((el("feed", {"name": "x"}),))))
    assert list(out) == ["restms"]


def test_J2_single_occurrence_is_still_an_array() -> None:
    document = Document((el("pipe", {"name": "p"}, el("join", {"href": "j"})),))
    out = orjson.loads(to_json(document))
    assert out == {"restms": {"pipe": [{"name": "p", "join": [{"href": "j"}]}]}}


def test_J2_children_grouped_by_type_in_first_appearance_order() -> None:
    document = Document(
        (
            el("message", {"n": "1"}),
            el("feed", {"n": "2"}),
            el("message", {"n": "3"}),
        )
    )
    out = orjson.loads(to_json(document))
    assert list(out["restms"]) == ["message", "feed"]
    assert out["restms"]["message"] == [{"n": "1"}, {"n": "3"}]
    assert out["restms"]["feed"] == [{"n": "2"}]


def test_J3_attributes_are_encoded_as_strings() -> None:
    out = orjson.loads(to_json(Document((el("message", {"count": "3", "async": "1"}),))))
    assert out["restms"]["message"] == [{"count": "3", "async": "1"}]


def test_J5_linked_content_has_no_value_key() -> None:
    body = b'<restms><content href="http://h/restms/resource/c1"/></restms>'
    out = orjson.loads(to_json(parse_xml(body)))
    assert out == {"restms": {"content": [{"href": "http://h/restms/resource/c1"}]}}


def test_J6_quotes_and_backslashes_are_escaped() -> None:
    value = 'say "hi" \\ bye\n'
    out = to_json(Document((el("feed", {"title": value}),)))
    assert b'\\"hi\\"' in out
    assert parse_json(out).elements[0].attrs["title"] == value


def test_J8_empty_document() -> None:
    assert to_json(Document()) == b'{"restms":{}}'


# ---------------------------------------------------------------- J3, J5, J8 decoding
@pytest.mark.parametrize(
    ("value", "expected"),
    [
        pytest.param(3, "3", id="int"),
        pytest.param(0, "0", id="zero"),
        pytest.param(-12, "-12", id="negative"),
        pytest.param(1.5, "1.5", id="float"),
        pytest.param(True, "1", id="true"),
        pytest.param(False, "0", id="false"),
        pytest.param("text", "text", id="string"),
        pytest.param("", "", id="empty-string"),
    ],
)
def test_J3_scalars_become_strings(value: object, expected: str) -> None:
    document = parse_json(doc({"restms": {"message": [{"count": value}]}}))
    assert document.elements[0].attrs == {"count": expected}


def test_J3_null_attribute_counts_as_absent() -> None:
    document = parse_json(doc({"restms": {"feed": [{"name": "x", "title": None}]}}))
    assert document.elements[0].attrs == {"name": "x"}


@pytest.mark.parametrize("key", ["value", "#text"])
def test_J5_content_text_key(key: str) -> None:
    body = doc({"restms": {"content": [{"type": "text/plain", key: "hi & bye"}]}})
    assert parse_json(body) == Document((el("content", {"type": "text/plain"}, text="hi & bye"),))


def test_J5_content_text_may_be_a_number() -> None:
    document = parse_json(doc({"restms": {"content": [{"value": 42}]}}))
    assert document.elements[0].text == "42"


def test_J5_value_on_header_is_an_attribute_not_text() -> None:
    body = doc({"restms": {"message": [{"header": [{"name": "h", "value": "v"}]}]}})
    header = parse_json(body).elements[0].children[0]
    assert header.attrs == {"name": "h", "value": "v"}
    assert header.text is None


@pytest.mark.parametrize(
    "body",
    [
        pytest.param(b'{"restms":{}}', id="empty-object"),
        pytest.param(b'{"restms":null}', id="null"),
        pytest.param(b' \n{"restms" : { } }\n', id="whitespace"),
    ],
)
def test_J8_empty_document_decodes(body: bytes) -> None:
    assert parse_json(body) == Document()


def test_J2_lone_object_is_accepted_as_one_element() -> None:
    document = parse_json(doc({"restms": {"feed": {"name": "x"}}}))
    assert document == Document((el("feed", {"name": "x"}),))


def test_J2_nested_children_and_order_within_type() -> None:
    body = doc(
        {
            "restms": {
                "message": [
                    {
                        "address": "a",
                        "header": [{"name": "1"}, {"name": "2"}],
                        "content": [{"href": "/c"}, {"value": "v"}],
                    }
                ]
            }
        }
    )
    message = parse_json(body).elements[0]
    assert message.attrs == {"address": "a"}
    assert message.children == (
        el("header", {"name": "1"}),
        el("header", {"name": "2"}),
        el("content", {"href": "/c"}),
        el("content", text="v"),
    )


def test_J1_keys_other_than_restms_are_ignored() -> None:
    document = parse_json(doc({"restms": {"feed": [{}]}, "other": [1, 2]}))
    assert document == Document((el("feed"),))


# ---------------------------------------------------------------- refusals
@pytest.mark.parametrize(
    "body",
    [
        pytest.param({"restms": {"feed": [{"title": "a\u0001b"}]}}, id="attribute"),
        pytest.param({"restms": {"content": [{"value": "nul\u0000"}]}}, id="content-text"),
        pytest.param({"restms": {"feed": [{"title": "\u001f"}]}}, id="unit-separator"),
        pytest.param({"restms": {"feed": [{"title": "\ufffe"}]}}, id="non-character"),
    ],
)
def test_J6_control_characters_are_refused(body: object) -> None:
    with pytest.raises(BadRequest, match="control character"):
        parse_json(doc(body))


def test_J6_tab_newline_and_cr_are_allowed() -> None:
    document = parse_json(doc({"restms": {"feed": [{"title": "a\tb\nc\rd"}]}}))
    assert document.elements[0].attrs["title"] == "a\tb\nc\rd"


@pytest.mark.parametrize(
    "body",
    [
        pytest.param({"restms": {"feed": ["x"]}}, id="string-item"),
        pytest.param({"restms": {"feed": [1]}}, id="number-item"),
        pytest.param({"restms": {"feed": [None]}}, id="null-item"),
        pytest.param({"restms": {"feed": [[{}]]}}, id="nested-array-item"),
        pytest.param({"restms": {"pipe": [{"join": ["x"]}]}}, id="nested-string-item"),
    ],
)
def test_J2_non_object_items_are_refused(body: object) -> None:
    with pytest.raises(BadRequest, match="JSON object"):
        parse_json(doc(body))


@pytest.mark.parametrize(
    "body",
    [
        pytest.param({"restms": {"message": [{"count": [3]}]}}, id="array-of-number"),
        pytest.param({"restms": {"message": [{"count": ["3"]}]}}, id="array-of-string"),
    ],
)
def test_J3_attribute_values_must_be_scalars(body: object) -> None:
    with pytest.raises(BadRequest):
        parse_json(doc(body))


@pytest.mark.parametrize(
    "body",
    [
        pytest.param({"restms": {"1feed": [{}]}}, id="digit-first"),
        pytest.param({"restms": {"a b": [{}]}}, id="space"),
        pytest.param({"restms": {"": [{}]}}, id="empty"),
        pytest.param({"restms": {"feed": [{"bad name": "x"}]}}, id="bad-property"),
        pytest.param({"restms": {"feed": [{"a:b": "x"}]}}, id="colon-property"),
    ],
)
def test_J4_names_must_be_xml_names(body: object) -> None:
    with pytest.raises(BadRequest, match="not a valid"):
        parse_json(doc(body))


@pytest.mark.parametrize(
    "body",
    [
        pytest.param(b"", id="empty"),
        pytest.param(b"  \n", id="blank"),
        pytest.param(b'{"restms":', id="truncated"),
        pytest.param(b"{'restms': {}}", id="single-quotes"),
        pytest.param(b'{"restms":{}} trailing', id="trailing-garbage"),
        pytest.param(b"<restms/>", id="xml"),
        pytest.param(b'{"restms":{"feed":[{"title":"\xff"}]}}', id="invalid-utf8"),
        pytest.param(b'{"restms":{"feed":[{"title":"\\ud800"}]}}', id="lone-surrogate"),
        pytest.param(b"[]", id="array-root"),
        pytest.param(b'"restms"', id="string-root"),
        pytest.param(b'{"other":{}}', id="no-restms-key"),
        pytest.param(b'{"restms":[]}', id="restms-array"),
        pytest.param(b'{"restms":"x"}', id="restms-string"),
    ],
)
def test_J1_malformed_json_is_bad_request(body: bytes) -> None:
    with pytest.raises(BadRequest) as info:
        parse_json(body)
    assert info.value.status == 400


# ---------------------------------------------------------------- limits
def test_depth_limit_applies_to_json() -> None:
    def nest(levels: int) -> dict[str, object]:
        node: dict[str, object] = {}
        for _ in range(levels):
            node = {"feed": [node]}
        return {"restms": node}

    limits = CodecLimits(max_depth=4)
    assert len(parse_json(doc(nest(3)), limits).elements) == 1
    with pytest.raises(BadRequest, match="deeper"):
        parse_json(doc(nest(4)), limits)


def test_element_count_limit_applies_to_json() -> None:
    limits = CodecLimits(max_elements=3)
    assert len(parse_json(doc({"restms": {"feed": [{}] * 3}}), limits).elements) == 3
    with pytest.raises(BadRequest, match="too many"):
        parse_json(doc({"restms": {"feed": [{}] * 4}}), limits)
    with pytest.raises(BadRequest, match="too many"):
        parse_json(doc({"restms": {"message": [{"header": [{}] * 3}]}}), limits)


def test_G3_xmlns_properties_in_json_are_dropped_not_echoed() -> None:
    document = parse_json(b'{"restms":{"feed":[{"xmlns":"urn:x","xmlns:a":"urn:y","name":"f"}]}}')
    (feed,) = document.elements
    assert dict(feed.attrs) == {"name": "f"}
    assert b"urn:x" not in to_xml(document)
