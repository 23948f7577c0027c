"""The publish fast path and the generic path always agree (or the fast path defers)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from restms import Format, RestMSError, decode, fastpath, specs
from restms.xmlcodec import CodecLimits
from tests.examples import examples

LIMITS = specs.MessageLimits(max_messages=5, max_headers=3, max_contents=3)
CODEC = CodecLimits(max_depth=4, max_elements=40)
COMPARED = 0.5  # the share of generated documents the fast path must take (0.75 to 0.95)

text = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12)
names = st.sampled_from(
    [
        "address",
        "message_id",
        "reply_to",
        "priority",
        "delivery_mode",
        "expiration",
        "type",
        "name",
        "value",
        "href",
        "encoding",
        "x-custom",
        "bad name",
        "xmlns",
    ]
)
# Property and field values that mean something: priorities and delivery modes in range
# and out, base64 good and bad, encodings, links.
SAMPLES = [
    "0",
    "9",
    "10",
    "2",
    "3",
    "aGk=",
    "a G\nk=",
    "!!",
    "plain",
    "base64",
    "/restms/resource/x",
    "http://h/restms/resource/y",
    "",
]
values = st.one_of(
    text,
    st.sampled_from(SAMPLES),
    st.integers(-3, 12),
    st.booleans(),
    st.none(),
    st.dictionaries(st.just("v"), st.just("x"), max_size=1),  # never a property (J3)
    st.lists(st.just("x"), max_size=1),
)
leaf = st.fixed_dictionaries(
    {}, optional={k: values for k in ["name", "value", "href", "type", "encoding", "#text"]}
)
message = st.dictionaries(names, values, max_size=4).flatmap(
    lambda attrs: st.fixed_dictionaries(
        {**{k: st.just(v) for k, v in attrs.items()}},
        optional={"header": st.lists(leaf, max_size=4), "content": st.lists(leaf, max_size=4)},
    )
)
documents = st.fixed_dictionaries(
    {"message": st.lists(message, max_size=7)}, optional={"feed": st.lists(leaf, max_size=1)}
)

# The shape the fast path takes, so that most documents are compared rather than
# deferred: one to five messages (LIMITS), nothing but messages in the root, every
# property and field a string under a valid name, and no character JSON must escape
# (a backslash sends a JSON body to the generic path, as does byte 0xEF: U+F000 up).
# The values still include refusals (a priority of 10, bad base64), which both paths
# must refuse alike.
plain = st.text(
    st.characters(
        codec="utf-8",
        exclude_categories=("Cs", "Cc"),
        exclude_characters='"\\',
        max_codepoint=0xEFFF,
    ),
    max_size=12,
)
strings = st.one_of(plain, st.sampled_from(SAMPLES))


def mostly(good: list[str], refused: str) -> st.SearchStrategy[str]:
    """One of the ``good`` values, or now and then one refused."""
    return st.sampled_from([*good, *good, *good, refused])


properties = {
    "address": strings,
    "message_id": strings,
    "reply_to": strings,
    "priority": mostly(["0", "5", "9"], "10"),
    "delivery_mode": mostly(["1", "2"], "3"),
    "expiration": mostly(["0", "60000"], "4294967296"),
}
taken_header = st.fixed_dictionaries(
    {"name": st.sampled_from(["x-a", "x-b", "name"]), "value": strings}
)
taken_content = st.fixed_dictionaries(
    {},
    optional={
        "value": strings,
        "type": st.sampled_from(["text/plain", "application/octet-stream"]),
        "encoding": mostly(["plain", "plain", "base64"], "gzip"),
    },
)
taken = st.fixed_dictionaries(
    {
        "message": st.lists(
            st.fixed_dictionaries(
                {},
                optional={
                    **properties,
                    "header": st.lists(taken_header, max_size=3),
                    "content": st.lists(taken_content, max_size=3),
                },
            ),
            min_size=1,
            max_size=LIMITS.max_messages,
        )
    }
)
# Seven in eight documents of the shape taken; the rest of any shape, so that one the
# fast path takes by mistake is compared too.
mostly_taken = st.integers(0, 7).flatmap(lambda n: documents if n == 0 else taken)


def _outcome(call):  # type: ignore[no-untyped-def]
    """The result, or the error's class: both paths must answer with the same status,
    though the first problem each names may differ (the generic path checks every
    name before any meaning)."""
    try:
        return ("ok", call())
    except RestMSError as exc:
        return (type(exc).__name__, exc.status)


def _check(body: bytes, fmt: Format) -> bool:
    """Whether the fast path took the body (and agreed with the generic path)."""
    fast = _outcome(lambda: fastpath.direct(body, fmt, CODEC, LIMITS))
    if fast == ("ok", None):
        return False  # deferred to the generic path
    generic = _outcome(lambda: specs.messages(decode(body, fmt, CODEC), LIMITS))
    assert fast == generic, body
    return True


def _agrees(encode: Callable[[dict[str, Any]], bytes], fmt: Format) -> None:
    """Both paths agree on generated documents, most of which the fast path takes: a
    property test that compared only a few would prove little."""
    tried, compared = 0, 0

    @settings(
        max_examples=examples(300), deadline=None, suppress_health_check=[HealthCheck.too_slow]
    )
    @given(mostly_taken)
    def agree(doc: dict[str, Any]) -> None:
        nonlocal tried, compared
        tried += 1
        compared += _check(encode(doc), fmt)

    agree()
    assert compared >= tried * COMPARED, f"{fmt.name}: only {compared} of {tried} compared"


def _xml(doc: dict) -> bytes:  # type: ignore[type-arg]
    from lxml import etree

    root = etree.Element("restms")
    for tag, items in doc.items():
        for item in items:
            node = etree.SubElement(root, tag)
            for key, value in item.items():
                if isinstance(value, dict):
                    continue  # JSON only (a wrongly typed property)
                if isinstance(value, list):
                    for child in value:
                        if not isinstance(child, dict):
                            continue
                        sub = etree.SubElement(node, key)
                        for k, v in child.items():
                            if v is None or k == "#text":
                                continue
                            try:
                                sub.set(k.replace(" ", "_"), str(v))
                            except ValueError:
                                return b"<restms/>"
                        if "#text" in child and isinstance(child["#text"], str):
                            try:
                                sub.text = child["#text"]
                            except ValueError:
                                return b"<restms/>"
                elif value is not None:
                    try:
                        node.set(key.replace(" ", "_"), str(value))
                    except ValueError:
                        return b"<restms/>"
    return etree.tostring(root)


def test_json_fast_path_agrees_with_the_generic_path() -> None:
    # unescaped UTF-8, as clients send it: an escape alone would defer the body
    _agrees(lambda doc: json.dumps({"restms": doc}, ensure_ascii=False).encode(), Format.JSON)


def test_xml_fast_path_agrees_with_the_generic_path() -> None:
    _agrees(_xml, Format.XML)


@pytest.mark.parametrize(
    ("body", "fmt"),
    [
        (b'<restms><message address="a"><content>hi</content></message></restms>', Format.XML),
        (b'{"restms":{"message":[{"address":"a","content":[{"value":"hi"}]}]}}', Format.JSON),
    ],
)
def test_common_shapes_take_the_fast_path(body: bytes, fmt: Format) -> None:
    result = fastpath.direct(body, fmt, CODEC, LIMITS)
    assert result is not None
    assert result == specs.messages(decode(body, fmt, CODEC), LIMITS)


@pytest.mark.parametrize(
    "body",
    [
        b"<restms><message><content><x/></content></message></restms>",  # nested: generic
        b'<restms><feed name="f"/><message/></restms>',  # another element: generic
        b"<restms/>",  # no message: the generic path words the error
    ],
)
def test_unusual_shapes_defer_to_the_generic_path(body: bytes) -> None:
    assert fastpath.direct(body, Format.XML, CODEC, LIMITS) is None


@pytest.mark.parametrize("fmt", list(Format))
@pytest.mark.parametrize(
    "values",
    [
        [0],
        [1],
        [specs.Duplicate(1)],
        [1, 2, 0],
        [2, specs.Duplicate(1)],
        [1, 1, specs.Duplicate(0)],  # one duplicate, last: the reply must still say so
        list(range(50)),
    ],
)
def test_F18_direct_count_reply_equals_the_generic_document(values: list[int], fmt: Format) -> None:
    from restms import Document, Element, encode

    def attrs(n: int) -> dict[str, str]:
        return (
            {"count": str(n), "duplicate": "1"}
            if isinstance(n, specs.Duplicate)
            else {"count": str(n)}
        )

    reference = Document(elements=tuple(Element("message", attrs(n)) for n in values))
    assert fastpath.counts(values, fmt) == encode(reference, fmt)


def test_G3_namespaced_attributes_defer_to_the_generic_path() -> None:
    body = (
        b'<restms xmlns:x="urn:x"><message x:address="a">'
        b'<content x:type="text/plain">hi</content></message></restms>'
    )
    assert fastpath.direct(body, Format.XML, CODEC, LIMITS) is None
    (message,) = specs.messages(decode(body, Format.XML, CODEC), LIMITS)
    assert message.address == "a"  # matched on the local name (G3)


@pytest.mark.parametrize(
    "body", [b'<restms><feed name="f"/><message address="x"/></restms>', b"<restms/>"]
)
def test_messages_falls_back_to_the_generic_path(body: bytes) -> None:
    """What the direct path defers is decided, and worded, by the generic path."""
    assert _outcome(lambda: fastpath.messages(body, Format.XML, CODEC, LIMITS)) == _outcome(
        lambda: specs.messages(decode(body, Format.XML, CODEC), LIMITS)
    )


@pytest.mark.parametrize(
    "body",
    [
        b'{"restms":{"message":[{"header":null}]}}',
        b'{"restms":{"message":[{"content":{"value":"x"}}]}}',
        b'{"restms":{"message":[{"address":"a","content":[{"value":"x","#text":"y"}]}]}}',
        b'{"restms":{"message":[{"address":1}]}}',
    ],
)
def test_json_shapes_the_fast_path_leaves_to_the_generic_path(body: bytes) -> None:
    assert fastpath.direct(body, Format.JSON, CODEC, LIMITS) is None
    _check(body, Format.JSON)


def test_json_message_heads_are_checked_the_same_when_remembered() -> None:
    """The second message has the same properties as the first: its head comes from
    the memo and must be what building it afresh gives."""
    one = {"address": "a", "priority": "7", "content": [{"type": "t", "value": "x"}]}
    body = json.dumps({"restms": {"message": [one, one]}}).encode()
    first, second = fastpath.direct(body, Format.JSON, CODEC, LIMITS) or ()
    assert first == second == specs.messages(decode(body, Format.JSON, CODEC), LIMITS)[0]


@pytest.mark.parametrize(
    ("value", "refused"), [("\ufffe", True), ("\uffff", True), ("\x01", True), ("a\\b", False)]
)
def test_json_strings_that_may_hold_what_xml_cannot_carry_defer(value: str, refused: bool) -> None:
    """U+FFFE and U+FFFF arrive as raw UTF-8 (byte 0xEF), controls and backslashes
    escaped: the generic path checks every string of such a body."""
    one = {"address": "a", "content": [{"value": value}]}
    body = json.dumps({"restms": {"message": [one]}}, ensure_ascii=False).encode()
    assert fastpath.direct(body, Format.JSON, CODEC, LIMITS) is None
    outcome = _outcome(lambda: fastpath.messages(body, Format.JSON, CODEC, LIMITS))
    assert (outcome[0] == "BadRequest") is refused


@pytest.mark.parametrize("fmt", list(Format))
@pytest.mark.parametrize("max_elements", [6, 7, 20, 21])
def test_a_batch_that_may_pass_the_element_limit_is_tallied(max_elements: int, fmt: Format) -> None:
    # Three messages of three elements: up to 3 * (1 + 3 + 3) = 21 allowed by LIMITS,
    # so under 21 the elements are counted (9), and over 9 the batch is read directly.
    one = b'<message><header name="h"/><content>x</content></message>'
    body = b"<restms>" + one * 3 + b"</restms>"
    if fmt is Format.JSON:
        item = {"header": [{"name": "h"}], "content": [{"value": "x"}]}
        body = json.dumps({"restms": {"message": [item] * 3}}).encode()
    codec = CodecLimits(max_depth=4, max_elements=max_elements)
    found = fastpath.direct(body, fmt, codec, LIMITS)
    if max_elements < 9:
        assert found is None  # the generic path words the error
    else:
        assert found == specs.messages(decode(body, fmt, codec), LIMITS)


# ---------------------------------------------------------------- attributes per element
def _attributes(count: int) -> str:
    return " ".join(f'a{n}="v"' for n in range(count))


@pytest.mark.parametrize(
    ("inner", "element"),
    [
        pytest.param(f"<message {_attributes(61)}/>", "message", id="message"),
        pytest.param(
            f"<message><header name='h' {_attributes(60)}/></message>", "header", id="header"
        ),
        pytest.param(
            f"<message><content {_attributes(61)}>x</content></message>", "content", id="content"
        ),
        pytest.param(f"<!-- --><message {_attributes(61)}/>", "message", id="tree"),
    ],
)
def test_over_the_attribute_limit_the_generic_path_refuses(inner: str, element: str) -> None:
    # Tags this long are not shared, so the scanner's builder counts their attributes.
    body = f"<restms>{inner}</restms>".encode()
    codec = CodecLimits(max_attributes=60)
    assert fastpath.direct(body, Format.XML, codec, LIMITS) is None
    with pytest.raises(RestMSError, match=f"<{element}> has more than 60 attributes"):
        fastpath.messages(body, Format.XML, codec, LIMITS)


@pytest.mark.parametrize("where", ["message", "header", "content"])
def test_over_the_key_limit_the_generic_path_refuses_json(where: str) -> None:
    many = {f"a{n}": "v" for n in range(4)}
    item = {"message": many} if where == "message" else {"message": {where: [many]}}
    body = json.dumps({"restms": item}).encode()
    codec = CodecLimits(max_attributes=3)
    assert fastpath.direct(body, Format.JSON, codec, LIMITS) is None
    with pytest.raises(RestMSError, match=f"<{where}> has more than 3 attributes"):
        fastpath.messages(body, Format.JSON, codec, LIMITS)


def test_a_tag_remembered_under_a_higher_limit_is_counted_under_a_lower_one() -> None:
    # The same short (shared) tag, read first where 64 attributes pass, then where 3 do.
    body = f"<restms><message {_attributes(4)}/></restms>".encode()
    assert fastpath.direct(body, Format.XML, CodecLimits(), LIMITS) is not None
    assert fastpath.direct(body, Format.XML, CodecLimits(max_attributes=3), LIMITS) is None


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b'{"restms":{"message":[{"address":{"x":1}}]}}', 'property "address" of <message>'),
        (b'{"restms":{"message":[{"address":"a","header":[{"name":["n"]}]}]}}', "<header>"),
        (b'{"restms":{"message":[{"content":[{"type":{}}]}]}}', 'property "type" of <content>'),
        (b'{"restms":{"message":[{"address":"a","address":"b"}]}}', "repeats the key 'address'"),
        (b'{"restms":{"message":[{"header":[{"name":"n","value":"1","value":"2"}]}]}}', "'value'"),
        (b'{"restms":{"message":[{"content":[{"value":"a","value":"b"}]}]}}', "'value'"),
        (b'{"restms":{"message":[{"address":"a"}],"message":[{"address":"b"}]}}', "'message'"),
        (b'{"restms":{"message":[{"address":"a:b","address":"c"}]}}', "'address'"),
    ],
)
def test_json_fast_path_leaves_malformed_properties_and_repeated_keys_to_the_refusal(
    body: bytes, reason: str
) -> None:
    assert fastpath.direct(body, Format.JSON, CODEC, LIMITS) is None
    with pytest.raises(RestMSError, match=reason) as refused:
        fastpath.messages(body, Format.JSON, CODEC, LIMITS)
    assert refused.value.status == 400


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b'<restms><message><address v="a"/></message></restms>', "<message>"),
        (b'<restms><message address="a"><header><name/></header></message></restms>', "<header>"),
        (b"<restms><message><content><type/></content></message></restms>", "<content>"),
    ],
)
def test_xml_fast_path_leaves_a_property_written_as_a_child_to_the_refusal(
    body: bytes, reason: str
) -> None:
    assert fastpath.direct(body, Format.XML, CODEC, LIMITS) is None
    with pytest.raises(RestMSError, match=f"of {reason} must be an attribute") as refused:
        fastpath.messages(body, Format.XML, CODEC, LIMITS)
    assert refused.value.status == 400


# ---------------------------------------------------------------- message heads with ids
PROPERTY_NAMES = ["address", *specs.MESSAGE_PROPERTIES]
near_max = st.text(min_size=specs.MAX_TEXT - 2, max_size=specs.MAX_TEXT + 2)
property_values = st.one_of(text, st.sampled_from(SAMPLES), near_max)


def _head_or_refusal(make: Callable[[], Any]) -> Any:
    try:
        return make()
    except RestMSError as exc:
        return type(exc), str(exc)


@given(st.dictionaries(st.sampled_from(PROPERTY_NAMES), property_values, max_size=6))
@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
def test_a_head_remembered_without_its_id_is_the_head(attrs: dict[str, str]) -> None:
    """A message's head read as the rest (remembered) plus its message_id is the head
    read whole, and a refusal is the same refusal."""
    assert _head_or_refusal(lambda: fastpath._head(attrs)) == _head_or_refusal(
        lambda: specs.message_head(attrs)
    )


def test_messages_with_ids_of_their_own_leave_the_memo_to_other_heads(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Heads with message ids are not remembered (each is seen once): after thousands
    of them, a new address is still remembered, in JSON and in XML."""
    monkeypatch.setattr(fastpath, "_ATTR_HEADS", {})  # empty, whatever ran before
    monkeypatch.setattr(fastpath, "_HEADS", {})
    limits = specs.MessageLimits()

    def batch(ids: range, address: str) -> list[dict[str, str]]:
        return [{"address": address, "message_id": f"id-{i}"} for i in ids]

    for first in range(0, 3000, 500):  # more ids than the memo holds
        body = json.dumps({"restms": {"message": batch(range(first, first + 500), "a.b")}})
        fastpath.messages(body.encode(), Format.JSON, CodecLimits(), limits)
    new = {"address": f"fresh.{len(fastpath._ATTR_HEADS)}"}
    fastpath.messages(
        json.dumps({"restms": {"message": [new]}}).encode(), Format.JSON, CodecLimits(), limits
    )
    assert tuple(new.items()) in fastpath._ATTR_HEADS
    remembered = len(fastpath._HEADS)
    tags = "".join(f'<message address="x.y" message_id="t-{i}"/>' for i in range(3000))
    xml = f'<restms xmlns="http://www.restms.org/schema/restms">{tags}</restms>'.encode()
    fastpath.messages(xml, Format.XML, CodecLimits(), specs.MessageLimits(max_messages=3000))
    assert len(fastpath._HEADS) == remembered
