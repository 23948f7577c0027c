"""Hypothesis round trips between the XML and JSON codecs (digest §2.4, J6; G5).

JSON groups children by type (J2), so the interleaving of different child types is
not carried; what must survive is every attribute, every child, and the order of
children within each type. Documents are compared in that grouped form.

XML cannot tell ``<content></content>`` from ``<content/>``, so an empty content
text and an absent one are the same value here (J5: neither has a ``"value"``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from restms import Document, Element, parse_json, parse_xml, to_json, to_xml
from restms.document import grouped
from restms.specs import PROPERTIES
from tests.examples import examples

SETTINGS = settings(max_examples=examples(200), deadline=None)

TAGS = ("feed", "pipe", "join", "message", "header", "content", "domain", "profile")
# Property names never equal a child type of their element (J4, _kids), and "value" on
# <content> is its text (J5).
ATTR_NAMES = (
    "name",
    "type",
    "title",
    "license",
    "href",
    "address",
    "message_id",
    "reply_to",
    "async",
    "count",
    "value",
    "encoding",
    "x-custom",
    "_private",
    "a.b",
)

# Any character XML 1.0 can carry, with the ones that need escaping made likely.
_XML_CHARS = st.characters(
    exclude_categories=("Cs",),
    exclude_characters="".join(chr(c) for c in range(0x20) if chr(c) not in "\t\n\r")
    + "\ufffe\uffff",
)
_SPECIAL = st.sampled_from(["&", "<", ">", '"', "'", "]]>", "&amp;", " ", "\t", "\n", "\r"])
TEXT = st.lists(st.one_of(_SPECIAL, _XML_CHARS), max_size=8).map("".join)


def _attrs(tag: str) -> st.SearchStrategy[dict[str, str]]:
    names = [n for n in ATTR_NAMES if not (tag == "content" and n == "value")]
    return st.dictionaries(st.sampled_from(names), TEXT, max_size=3)


# Built once per tag: strategies made inside a flatmap are rebuilt on every draw.
_ATTRS = {tag: _attrs(tag) for tag in TAGS}
_TEXTS = {tag: st.none() | TEXT if tag == "content" else st.none() for tag in TAGS}


def _element(
    children: st.SearchStrategy[tuple[Element, ...]],
) -> st.SearchStrategy[Element]:
    return st.one_of(
        [
            st.builds(Element, st.just(tag), _ATTRS[tag], children.map(_kids(tag)), _TEXTS[tag])
            for tag in TAGS
        ]
    )


def _kids(tag: str) -> Callable[[tuple[Element, ...]], tuple[Element, ...]]:
    """Children the grammar allows a ``tag``: none named as one of its properties (J4;
    JSON refuses an object under a property's name, J3), such as a join's ``feed``."""
    properties = PROPERTIES[tag]
    return lambda kids: tuple(kid for kid in kids if kid.tag not in properties)


ELEMENTS = st.recursive(
    _element(st.just(())),
    lambda kids: _element(st.lists(kids, max_size=3).map(tuple)),
    max_leaves=8,
)
DOCUMENTS = st.lists(ELEMENTS, max_size=3).map(lambda els: Document(tuple(els)))


def canonical(node: Document | Element) -> Any:
    """The J6 view of a document: attributes, text and children grouped by type."""
    if isinstance(node, Document):
        kids = node.elements
        head: tuple[Any, ...] = ("restms",)
    else:
        kids = node.children
        head = (node.tag, dict(node.attrs), node.text or None)
    # Types in order of first appearance (J2), then each type's children in order.
    groups = [(tag, [canonical(k) for k in items]) for tag, items in grouped(kids).items()]
    return (*head, groups)


def exact(node: Document | Element) -> Any:
    """Like :func:`canonical`, but keeping the order of children of different types."""
    if isinstance(node, Document):
        return ("restms", [exact(k) for k in node.elements])
    return (node.tag, dict(node.attrs), node.text or None, [exact(k) for k in node.children])


def via_json(document: Document) -> Document:
    return parse_xml(to_xml(parse_json(to_json(document))))


def via_xml(document: Document) -> Document:
    return parse_json(to_json(parse_xml(to_xml(document))))


@SETTINGS
@given(DOCUMENTS)
def test_G5_xml_serialisation_is_lossless(document: Document) -> None:
    assert exact(parse_xml(to_xml(document))) == exact(document)


@SETTINGS
@given(DOCUMENTS)
def test_J6_json_serialisation_is_lossless_within_each_type(document: Document) -> None:
    assert canonical(parse_json(to_json(document))) == canonical(document)


@SETTINGS
@given(DOCUMENTS)
def test_J6_xml_to_json_to_xml_is_lossless(document: Document) -> None:
    from_xml = parse_xml(to_xml(document))
    again = parse_xml(to_xml(parse_json(to_json(from_xml))))
    assert canonical(again) == canonical(from_xml)
    # A second trip through JSON changes nothing at all: the grouped order is stable.
    assert via_json(again) == again


@SETTINGS
@given(DOCUMENTS)
def test_J6_json_to_xml_to_json_is_lossless(document: Document) -> None:
    from_json = parse_json(to_json(document))
    again = via_xml(from_json)
    assert canonical(again) == canonical(from_json)
    # A second trip through XML gives byte-identical JSON.
    assert to_json(via_xml(again)) == to_json(again)
