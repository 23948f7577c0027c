"""The JSON mapping (digest §2.4, J1-J8), including the §2.3 worked example."""

from __future__ import annotations

import json
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

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
from restms.jsoncodec import unique_keys
from restms.specs import PROPERTIES
from tests.examples import examples

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


def _placed_xml(tag: str, inner: str) -> bytes:
    """An XML document holding a ``tag`` element with ``inner`` where that type belongs."""
    body = f"<{tag}>{inner}</{tag}>"
    for outer in reversed(_PLACES[tag]):
        body = f"<{outer}>{body}</{outer}>"
    return f"<restms>{body}</restms>".encode()


@pytest.mark.parametrize(
    ("tag", "name"), [(tag, name) for tag in sorted(PROPERTIES) for name in sorted(PROPERTIES[tag])]
)
def test_J3_a_property_written_as_a_child_is_refused_in_xml_as_in_json(tag: str, name: str) -> None:
    with pytest.raises(BadRequest, match=f'^property "{name}" of <{tag}> must be an attribute$'):
        parse_xml(_placed_xml(tag, f'<{name} v="x"/>'))
    with pytest.raises(BadRequest, match=f'^property "{name}" of <{tag}> must be a string'):
        parse_json(_placed(tag, {name: [{"v": "x"}]}))


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


def test_an_array_longer_than_the_element_budget_is_refused_before_its_items_are_read() -> None:
    # The items are not even objects: the count alone refuses the array, so a 4 MiB
    # array of tiny items costs no conversion at all (tests/app/test_decoder_stall.py).
    limits = CodecLimits(max_elements=3)
    with pytest.raises(BadRequest, match="too many elements"):
        parse_json(doc({"restms": {"message": [{"header": ["x"] * 3}]}}), limits)
    with pytest.raises(BadRequest, match="must be a JSON object"):
        parse_json(doc({"restms": {"message": [{"header": ["x"] * 2}]}}), limits)


def test_G3_xmlns_properties_in_json_are_dropped_not_echoed() -> None:
    document = parse_json(b'{"restms":{"feed":[{"xmlns":"urn:x","xmlns:a":"urn:y","name":"f"}]}}')
    (feed,) = document.elements
    assert dict(feed.attrs) == {"name": "f"}
    assert b"urn:x" not in to_xml(document)


# ---------------------------------------------------------------- keys per object
def keys(count: int) -> dict[str, str]:
    return {f"a{n}": "v" for n in range(count)}


def test_key_limit_allows_exactly_the_limit() -> None:
    document = parse_json(doc({"restms": {"feed": [keys(3)]}}), CodecLimits(max_attributes=3))
    assert document.elements[0].attrs == keys(3)


@pytest.mark.parametrize(
    ("body", "element"),
    [
        pytest.param({"feed": [keys(4)]}, "feed", id="properties"),
        pytest.param(
            {"message": [{**keys(2), "header": [], "content": []}]}, "message", id="mixed"
        ),
        pytest.param({"message": [{"header": [{"name": "h", **keys(3)}]}]}, "header", id="nested"),
        pytest.param(keys(4), "restms", id="root"),
    ],
)
def test_key_limit_refuses_more_naming_the_element(body: dict[str, object], element: str) -> None:
    # An object's keys are its attributes, child arrays and text included.
    with pytest.raises(BadRequest, match=f"<{element}> has more than 3 attributes"):
        parse_json(doc({"restms": body}), CodecLimits(max_attributes=3))


def test_names_are_at_most_as_long_as_xml_allows() -> None:
    longest = "a" * 50_000
    assert parse_json(doc({"restms": {"feed": [{longest: "v"}]}})).elements[0].attrs == {
        longest: "v"
    }
    with pytest.raises(BadRequest, match=r"'aaaa.*\.\.\. \(50001 characters\) is not a valid"):
        parse_json(doc({"restms": {"feed": [{longest + "a": "v"}]}}))


# Where each element type sits in a document (the element types enclosing it), so that
# a wrongly typed property is tried where that element really is.
_PLACES = {
    "domain": (),
    "profile": ("domain",),
    "feed": (),
    "pipe": (),
    "join": ("pipe",),
    "message": (),
    "header": ("message",),
    "content": ("message",),
}
_SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**63), 2**63 - 1), st.text(max_size=3)
)
_NOT_STRINGS = st.one_of(
    st.dictionaries(st.sampled_from(["v", "x", "value", "#text", "name"]), _SCALARS, max_size=3),
    st.lists(st.one_of(_SCALARS, st.dictionaries(st.just("a"), _SCALARS)), max_size=3),
)


def _placed(tag: str, element: dict[str, Any]) -> bytes:
    """A JSON document holding ``element`` (of type ``tag``) where that type belongs."""
    body: dict[str, Any] = {tag: [element]}
    for outer in reversed(_PLACES[tag]):
        body = {outer: [body]}
    return orjson.dumps({"restms": body})


def test_every_element_with_properties_has_a_place() -> None:
    assert set(PROPERTIES) == set(_PLACES)


@settings(max_examples=examples(600), deadline=None)
@given(
    st.sampled_from(
        [(tag, name) for tag in sorted(PROPERTIES) for name in sorted(PROPERTIES[tag])]
    ),
    _NOT_STRINGS,
    st.booleans(),
)
def test_J3_an_object_or_array_where_a_property_belongs_is_refused(
    property_: tuple[str, str], wrong: Any, among_others: bool
) -> None:
    tag, name = property_
    element = {"title": "t", name: wrong, "zz": 1} if among_others else {name: wrong}
    with pytest.raises(BadRequest) as refused:
        parse_json(_placed(tag, element))
    kind = "an array" if isinstance(wrong, list) else "an object"
    assert str(refused.value) == f'property "{name}" of <{tag}> must be a string, not {kind}'


@pytest.mark.parametrize("key", ["value", "#text"])
@pytest.mark.parametrize("wrong", [{"v": "x"}, [], ["x"]])
def test_J3_J5_a_content_text_that_is_an_object_or_array_is_refused(key: str, wrong: Any) -> None:
    with pytest.raises(BadRequest, match=f'"{key}" of <content> must be a string'):
        parse_json(_placed("content", {"type": "text/plain", key: wrong}))


def test_G6_an_unknown_key_holding_an_object_stays_an_unknown_child_as_in_xml() -> None:
    as_json = parse_json(_placed("feed", {"name": "f", "gadget": {"size": "3"}}))
    as_xml = parse_xml(b'<restms><feed name="f"><gadget size="3"/></feed></restms>')
    assert as_json == as_xml


def test_J3_numbers_and_booleans_still_become_strings() -> None:
    got = parse_json(_placed("pipe", {"lease": 5, "durable": True, "title": None}))
    assert got.elements[0].attrs == {"lease": "5", "durable": "1"}


_REPEATED = [
    b'{"restms": {}, "restms": null}',
    b'{"restms": {"feed": [{"name": "a"}], "feed": [{"name": "b"}]}}',
    b'{"restms": {"feed": [{"name": "a", "type": "topic", "name": "b"}]}}',
    b'{"restms": {"message": [{"address": "a", "header": [{"name": "n", "name": "m"}]}]}}',
    b'{"restms": {"message": [{"content": [{"type": "text/plain", "value": "a", "value": "b"}]}]}}',
    b'{"restms": {"pipe": [{"join": [{"feed": "f", "address": "a" , "address" :"b"}]}]}}',
    b'{"restms": {"feed": [{"name": "a:b", "gadget": {"size": "1", "size": "2"}}]}}',
    b'{"other": {"x": 1, "x": 2}, "restms": {}}',
    rb'{"restms": {"message": [{"address": "\": \"", "address": "b"}]}}',
]


@pytest.mark.parametrize("body", _REPEATED)
def test_a_repeated_key_at_any_level_is_refused(body: bytes) -> None:
    json.loads(body)  # valid JSON otherwise
    with pytest.raises(BadRequest, match="JSON object repeats the key"):
        parse_json(body)


@pytest.mark.parametrize(
    "body",
    [
        rb'{"restms": {"message": [{"address": "a:b", "x": "{\"x\": 1, \"x\": 2}"}]}}',
        b'{"restms": {}, "other": {"x": {"y": 1}, "z": [{"y": 2}]}}',
        b'{"restms" : {"feed" : [ {"name" : "http://a:b"} ]}}',
    ],
)
def test_colons_in_strings_and_unread_objects_are_no_repeated_keys(body: bytes) -> None:
    assert parse_json(body) == parse_json(orjson.dumps(json.loads(body)))


def test_objects_outside_restms_are_read_for_repeats_within_the_limits() -> None:
    # A colon in a string makes the keys be counted again, by the standard parser.
    many = b'{"restms": {"feed": [{"name": "a:b"}]}, "x": [%s]}' % b",".join([b'{"k": 1}'] * 5)
    assert parse_json(many, CodecLimits(max_elements=6)).elements[0].attrs == {"name": "a:b"}
    with pytest.raises(BadRequest, match="document has too many elements"):
        parse_json(many, CodecLimits(max_elements=5))  # the feed and 5 more
    deep = b'{"restms": {"feed": [{"name": "a:b"}]}, "x": %s1%s}' % (b'{"k":' * 1000, b"}" * 1000)
    with pytest.raises(BadRequest, match="document nested deeper than 16 levels"):
        parse_json(deep)


_TEXT = st.text(st.sampled_from(["a", ":", '"', "\\", " ", "\u00e9", "\n"]), max_size=4)


def _pairs_json(pairs: list[tuple[str, str]]) -> str:
    return "{" + ", ".join(f"{json.dumps(k)} :{v}" for k, v in pairs) + "}"


_OBJECTS = st.recursive(
    st.lists(st.tuples(_TEXT, _TEXT.map(json.dumps)), max_size=4).map(_pairs_json),
    lambda inner: st.lists(
        st.tuples(
            st.one_of(_TEXT, st.just("k")),
            st.one_of(
                _TEXT.map(json.dumps),
                inner,
                st.lists(inner, max_size=2).map(", ".join).map("[{}]".format),
            ),
        ),
        max_size=4,
    ).map(_pairs_json),
    max_leaves=8,
)


def _keys(value: Any) -> int:
    if isinstance(value, dict):
        return len(value) + sum(map(_keys, value.values()))
    if isinstance(value, list):
        return sum(map(_keys, value))
    return 0


@settings(max_examples=examples(600), deadline=None)
@given(_OBJECTS)
def test_unique_keys_is_true_exactly_when_no_object_repeats_a_key(text: str) -> None:
    body = text.encode()
    repeated = [False]

    def note(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        repeated[0] |= len(dict(pairs)) != len(pairs)
        return dict(pairs)

    json.loads(body, object_pairs_hook=note)
    assert unique_keys(body, _keys(orjson.loads(body))) is not repeated[0], body
