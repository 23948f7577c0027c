"""The RestMS protocol, sans-IO: documents, codecs, specs, URIs, ETags and errors.

Nothing here touches a socket or the event loop, and nothing imports another
project package. See ``shared/restms-digest.md`` for the requirement IDs cited.
"""

from .document import NAMESPACE, Document, Element
from .errors import (
    BadRequest,
    Forbidden,
    MethodNotAllowed,
    NotAcceptable,
    NotFound,
    NotImplementedFeature,
    PayloadTooLarge,
    PreconditionFailed,
    RestMSError,
    ServiceUnavailable,
    Unauthorized,
    UnsupportedMediaType,
)
from .jsoncodec import parse_json, to_json
from .media import Format, body_format, negotiate
from .xmlcodec import CodecLimits, parse_xml, to_xml

__all__ = [
    "NAMESPACE",
    "BadRequest",
    "CodecLimits",
    "Document",
    "Element",
    "Forbidden",
    "Format",
    "MethodNotAllowed",
    "NotAcceptable",
    "NotFound",
    "NotImplementedFeature",
    "PayloadTooLarge",
    "PreconditionFailed",
    "RestMSError",
    "ServiceUnavailable",
    "Unauthorized",
    "UnsupportedMediaType",
    "body_format",
    "negotiate",
    "parse_json",
    "parse_xml",
    "to_json",
    "to_xml",
]


def decode(body: bytes, fmt: Format, limits: CodecLimits | None = None) -> Document:
    """Decode a structured body in the given format."""
    if fmt is Format.JSON:
        return parse_json(body, limits) if limits else parse_json(body)
    return parse_xml(body, limits) if limits else parse_xml(body)


def encode(document: Document, fmt: Format) -> bytes:
    """Encode a document in the given format."""
    return to_json(document) if fmt is Format.JSON else to_xml(document)
