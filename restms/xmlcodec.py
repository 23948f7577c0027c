"""RestTL documents as XML (1/RestTL; digest §2.1, G1-G7), with one hardened parser.

Parsing is defensive because bodies come from the open internet:

* no DTD is loaded, no entity is resolved, no network is touched, and a document
  that declares a DOCTYPE at all is refused (billion-laughs and XXE both need one);
* nesting depth and element count are bounded (:class:`CodecLimits`);
* namespaces are ignored and names matched on their local part (G3, L1);
* whitespace-only text is dropped; only ``<content>`` keeps its text (G7).

Serialising writes the text directly, escaping ``&``, ``<``, ``>``, ``"`` and the
white space that attribute normalisation would otherwise change (G5).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from lxml import etree

from .document import NAMESPACE, ROOT, TEXT_ELEMENTS, Document, Element
from .errors import BadRequest


@dataclass(frozen=True, slots=True, kw_only=True)
class CodecLimits:
    """Shape limits applied while decoding, whatever the media type."""

    max_depth: int = 16
    max_elements: int = 200_000

    def __post_init__(self) -> None:
        if self.max_depth < 3 or self.max_elements < 1:
            raise ValueError("codec limits too small to hold a message document")


DEFAULT_LIMITS = CodecLimits()

# lxml parser objects must not be shared between threads: keep one per thread.
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


def _local_name(name: str) -> str:
    return name.rpartition("}")[2] if name[:1] == "{" else name


def parse_xml(body: bytes, limits: CodecLimits = DEFAULT_LIMITS) -> Document:
    """Decode an XML RestTL document, or raise :class:`BadRequest` saying why."""
    root = parse_root(body)
    budget = [limits.max_elements]
    return Document(elements=_children(root, 1, limits.max_depth, budget))


def parse_root(body: bytes) -> etree._Element:
    """Parse with the hardened parser and check the root; the lxml tree, for fast paths."""
    if not body.strip():
        raise BadRequest("empty document: expected <restms> XML")
    try:
        root = etree.fromstring(body, _parser())
    except etree.XMLSyntaxError as exc:
        raise BadRequest(f"malformed XML: {exc.msg}") from exc
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
        if len(_LOCAL) < 256:  # tags are client-chosen: keep the cache bounded
            _LOCAL[tag] = local
    return local


def _children(
    node: etree._Element, depth: int, max_depth: int, budget: list[int]
) -> tuple[Element, ...]:
    out = []
    for child in node:
        tag = child.tag
        if not isinstance(tag, str):  # an unresolved entity reference or similar
            continue
        budget[0] -= 1
        if budget[0] < 0:
            raise BadRequest("document has too many elements")
        if depth >= max_depth:
            raise BadRequest(f"document nested deeper than {max_depth} levels")
        local = local_tag(tag)
        attrs: dict[str, str] = dict(child.attrib)  # type: ignore[arg-type]
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
        kids = _children(child, depth + 1, max_depth, budget) if nested else ()
        out.append(Element(local, attrs, kids, text))
    return tuple(out)


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
