"""RestTL documents as XML (1/RestTL; digest §2.1, G1-G7), with one hardened parser.

Parsing is defensive because bodies come from the open internet:

* no DTD is loaded, no entity is resolved, no network is touched, and a document
  that declares a DOCTYPE at all is refused (billion-laughs and XXE both need one);
* nesting depth, element count and attributes per element are bounded
  (:class:`CodecLimits`). The attributes are counted before they are read: lxml
  finds each attribute's value by walking the element's attribute list, so reading
  them all (``dict(attrib)``, even ``items()``) takes time quadratic in their number,
  where counting them is one walk;
* namespaces are ignored and names matched on their local part (G3, L1);
* whitespace-only text is dropped; only ``<content>`` keeps its text (G7).

Serialising writes the text directly, escaping ``&``, ``<``, ``>``, ``"`` and the
white space that attribute normalisation would otherwise change (G5).
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass
from typing import cast

from lxml import etree

from .document import NAMESPACE, ROOT, TEXT_ELEMENTS, Document, Element
from .errors import BadRequest
from .specs import PROPERTIES


@dataclass(frozen=True, slots=True, kw_only=True)
class CodecLimits:
    """Shape limits applied while decoding, whatever the media type."""

    max_depth: int = 16
    max_elements: int = 200_000
    max_attributes: int = 64  # on one element; a JSON object's keys count as its attributes

    def __post_init__(self) -> None:
        if self.max_depth < 3 or self.max_elements < 1 or self.max_attributes < 1:
            raise ValueError("codec limits too small to hold a message document")


DEFAULT_LIMITS = CodecLimits()

# lxml parser and XPath objects must not be shared between threads: one per thread.
_local = threading.local()


def _parser() -> etree.XMLParser:
    parser: etree.XMLParser | None = getattr(_local, "parser", None)
    if parser is None:
        parser = etree.XMLParser(
            resolve_entities=False,
            no_network=True,
            load_dtd=False,
            dtd_validation=False,
            huge_tree=False,
            remove_comments=True,
            remove_pis=True,
            collect_ids=False,
        )
        _local.parser = parser
    return parser


def _elements(root: etree._Element) -> float:
    """How many elements the tree holds, its root included (XPath counts in C)."""
    counter: etree.XPath | None = getattr(_local, "counter", None)
    if counter is None:
        counter = _local.counter = etree.XPath("count(//*)")
    return cast(float, counter(root))


def _local_name(name: str) -> str:
    return name.rpartition("}")[2] if name[:1] == "{" else name


def parse_xml(body: bytes, limits: CodecLimits = DEFAULT_LIMITS) -> Document:
    """Decode an XML RestTL document, or raise :class:`BadRequest` saying why."""
    root = parse_root(body)
    if len(root.attrib) > limits.max_attributes:
        raise too_many_attributes(ROOT, limits.max_attributes)
    # Counted in C before any is read: a document over the limit costs no more than
    # its parse (the root is not one of the elements).
    if _elements(root) > limits.max_elements + 1:
        raise BadRequest("document has too many elements")
    return Document(elements=_children(root, 1, limits, _NONE))


def too_many_attributes(tag: str, most: int) -> BadRequest:
    """The refusal of an element with more than ``most`` attributes (JSON: keys)."""
    return BadRequest(f"element <{tag}> has more than {most} attributes")


# lxml's message: libxml2's, then ", line L, column C"; libxml2's own often ends with
# " line L" too (where the tag it speaks of began), the same line when that is the line
# of the error: said once.
_SYNTAX_AT = re.compile(r"(.*?)(?: line (\d+))?, line (\d+), column (\d+)", re.S)


def syntax_error(message: str) -> str:
    """``"Couldn't find end of Start Tag feed line 1, line 1, column 14"`` ->
    ``"Couldn't find end of Start Tag feed at line 1, column 14"``."""
    found = _SYNTAX_AT.fullmatch(message)
    if found is None:
        return message
    text, began, line, column = found.groups()
    if began is not None and began != line:
        text += f" (begun on line {began})"
    return f"{text} at line {line}, column {column}"


def parse_root(body: bytes) -> etree._Element:
    """Parse with the hardened parser and check the root; the lxml tree, for fast paths."""
    if not body.strip():
        raise BadRequest("empty document: expected <restms> XML")
    try:
        root = etree.fromstring(body, _parser())
    except etree.XMLSyntaxError as exc:
        raise BadRequest(f"malformed XML: {syntax_error(exc.msg)}") from exc
    except ValueError as exc:
        raise BadRequest(f"malformed XML: {exc}") from exc
    if getattr(root.getroottree().docinfo, "doctype", ""):
        raise BadRequest("XML documents with a DOCTYPE are not accepted")
    if not isinstance(root.tag, str) or _local_name(root.tag) != ROOT:
        raise BadRequest(f"root element must be <{ROOT}>")
    return root


_LOCAL: dict[str, str] = {}  # tag -> local name, for the few tags documents use


def local_tag(tag: str) -> str:
    local = _LOCAL.get(tag)
    if local is None:
        local = _local_name(tag)
        if len(_LOCAL) < 256 and len(tag) <= 256:  # client-chosen: keep the cache small
            _LOCAL[tag] = local
    return local


def _children(
    node: etree._Element, depth: int, limits: CodecLimits, properties: frozenset[str]
) -> tuple[Element, ...]:
    """The elements under ``node``, whose properties (as :data:`restms.specs.PROPERTIES`
    has them) are ``properties``."""
    max_depth, most = limits.max_depth, limits.max_attributes
    out = []
    for child in node:
        tag = child.tag
        if not isinstance(tag, str):  # an unresolved entity reference or similar
            continue
        if depth >= max_depth:
            raise BadRequest(f"document nested deeper than {max_depth} levels")
        local = local_tag(tag)
        if local in properties:  # a property written as a child: refused as in JSON (J3)
            parent = local_tag(node.tag)
            raise BadRequest(f'property "{local}" of <{parent}> must be an attribute')
        if len(child.attrib) > most:  # counted first: reading them is quadratic
            raise too_many_attributes(local, most)
        attrs: dict[str, str] = dict(child.items())  # type: ignore[arg-type]
        for key in attrs:
            if key[0] == "{":  # a namespaced attribute: match on its local name (G3)
                attrs = {_local_name(k): v for k, v in attrs.items()}
                break
        nested = len(child)
        text = None
        if local in TEXT_ELEMENTS:
            # The element's own text only (text inside a child belongs to the child,
            # J6), and an empty element has no value at all (J5: no "value" key).
            if nested:
                text = "".join([child.text or "", *(str(k.tail or "") for k in child)]) or None
            else:
                text = child.text or None
        kids = _children(child, depth + 1, limits, PROPERTIES.get(local, _NONE)) if nested else ()
        out.append(Element(local, attrs, kids, text))
    return tuple(out)


_NONE: frozenset[str] = frozenset()


_HEAD = f"<?xml version='1.0' encoding='UTF-8'?>\n<{ROOT} xmlns=\"{NAMESPACE}\"".encode()
_EMPTY = _HEAD + b"/>"


def _text(value: str) -> str:
    """Escape element text: ``&``, ``<`` and ``>`` (so ``]]>`` cannot appear)."""
    if "&" in value:
        value = value.replace("&", "&amp;")
    if "<" in value:
        value = value.replace("<", "&lt;")
    if ">" in value:
        value = value.replace(">", "&gt;")
    if "\r" in value:
        value = value.replace("\r", "&#13;")  # a raw CR would be normalised away
    return value


def _attr(value: str) -> str:
    """Escape an attribute value; white space other than a space survives as a reference."""
    value = _text(value)
    if '"' in value:
        value = value.replace('"', "&quot;")
    if "\n" in value:
        value = value.replace("\n", "&#10;")
    if "\t" in value:
        value = value.replace("\t", "&#9;")
    return value


def to_xml(document: Document) -> bytes:
    """Encode a document as UTF-8 XML with a declaration (G1, G3, G5).

    Written directly rather than through a tree: replies are small and many, and a
    tree costs more than the document. Names come from the codecs, which only admit
    valid XML names, and values are escaped here; the round-trip tests parse every
    output back with the hardened parser.
    """
    if not document.elements:
        return _EMPTY
    out = [">"]
    for element in document.elements:
        _write(out, element)
    out.append(f"</{ROOT}>")
    return _HEAD + "".join(out).encode()


def _write(out: list[str], element: Element) -> None:
    tag = element.tag
    out.append(f"<{tag}")
    for key, value in element.attrs.items():
        out.append(f' {key}="{_attr(value)}"')
    if element.text is None and not element.children:
        out.append("/>")
        return
    out.append(">")
    if element.text is not None:
        out.append(_text(element.text))
    for child in element.children:
        _write(out, child)
    out.append(f"</{tag}>")
