"""RestTL documents as XML (1/RestTL; digest §2.1, G1-G7), with one hardened parser.

Parsing is defensive because bodies come from the open internet:

* no DTD is loaded, no entity is resolved, no network is touched, and a document
  that declares a DOCTYPE at all is refused (billion-laughs and XXE both need one);
* nesting depth and element count are bounded (:class:`CodecLimits`);
* namespaces are ignored and names matched on their local part (G3, L1);
* whitespace-only text is dropped; only ``<content>`` keeps its text (G7).

Serialising goes through lxml too, so ``&``, ``<`` and ``"`` are always escaped (G5).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

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
    budget = [limits.max_elements]
    return Document(elements=_children(root, 1, limits.max_depth, budget))


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
        local = _local_name(tag)
        attrs = {_local_name(str(k)): str(v) for k, v in child.attrib.items()}
        text = None
        if local in TEXT_ELEMENTS:
            # The element's own text only (text inside a child belongs to the child,
            # J6), and an empty element has no value at all (J5: no "value" key).
            own = [child.text or "", *(str(k.tail or "") for k in child)]
            text = "".join(own) or None
        kids = _children(child, depth + 1, max_depth, budget) if len(child) else ()
        out.append(Element(local, attrs, kids, text))
    return tuple(out)


_ROOT_TAG = f"{{{NAMESPACE}}}{ROOT}"
_NSMAP: Any = {None: NAMESPACE}  # the default namespace (lxml-stubs type the key as str)


def to_xml(document: Document) -> bytes:
    """Encode a document as UTF-8 XML with a declaration (G1, G3)."""
    root = etree.Element(_ROOT_TAG, nsmap=_NSMAP)
    for element in document.elements:
        _build(root, element)
    out: bytes = etree.tostring(root, xml_declaration=True, encoding="UTF-8")
    return out


def _build(parent: etree._Element, element: Element) -> None:
    node = etree.SubElement(parent, f"{{{NAMESPACE}}}{element.tag}")
    for key, value in element.attrs.items():
        node.set(key, value)
    if element.text is not None:
        node.text = element.text
    for child in element.children:
        _build(node, child)
