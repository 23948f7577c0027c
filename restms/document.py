"""The RestTL document model (1/RestTL; digest §2): a root ``<restms>`` holding elements.

A document is schema-agnostic: elements have a type (their tag), string properties
(XML attributes, never child elements, G2) and child elements. Only ``<content>``
carries element text (G7, J5). The codecs in :mod:`restms.xmlcodec` and
:mod:`restms.jsoncodec` turn bytes into these values and back; :mod:`restms.specs`
reads typed resource specs out of them.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

NAMESPACE = "http://www.restms.org/schema/restms"
ROOT = "restms"
# Only these element types carry meaningful text (G7, J5).
TEXT_ELEMENTS = frozenset({"content"})
# Characters XML 1.0 cannot carry (C0 controls but tab, LF, CR; surrogates; U+FFFE/F).
NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")


@dataclass(frozen=True, slots=True)
class Element:
    """One resource element: its type, its properties and its child elements."""

    tag: str
    attrs: Mapping[str, str] = field(default_factory=dict)
    children: tuple[Element, ...] = ()
    text: str | None = None

    def get(self, name: str) -> str | None:
        """A property value, with empty strings counted as absent (C8)."""
        value = self.attrs.get(name)
        return value if value else None

    def iter(self, tag: str) -> Iterator[Element]:
        """Direct children of one type, in document order."""
        return (child for child in self.children if child.tag == tag)


@dataclass(frozen=True, slots=True)
class Document:
    """The root ``<restms>`` element's children."""

    elements: tuple[Element, ...] = ()

    def iter(self, tag: str) -> Iterator[Element]:
        return (el for el in self.elements if el.tag == tag)


def grouped(children: tuple[Element, ...]) -> dict[str, list[Element]]:
    """Children grouped by type, types in order of first appearance (J2, J6)."""
    groups: dict[str, list[Element]] = {}
    for child in children:
        groups.setdefault(child.tag, []).append(child)
    return groups
