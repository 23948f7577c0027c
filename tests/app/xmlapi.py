"""Helpers the XML-first HTTP tests share: one request function and one reply type."""

from __future__ import annotations

import dataclasses
import json
from email.utils import parsedate_to_datetime
from typing import Any

from lxml import etree
from multidict import CIMultiDictProxy
from yarl import URL

from tests.conftest import Gateway

XML = "application/restms+xml"
JSON = "application/restms+json"
NS = "http://www.restms.org/schema/restms"
XML_TYPES = (XML, "text/xml")


def local(el: etree._Element) -> str:
    return etree.QName(el).localname


def looks_like_json(text: str) -> bool:
    try:
        return isinstance(json.loads(text), dict | list)
    except ValueError:
        return False


@dataclasses.dataclass
class Reply:
    status: int
    headers: CIMultiDictProxy[str]
    body: bytes

    @property
    def media_type(self) -> str:
        return self.headers.get("Content-Type", "").split(";")[0].strip()

    def root(self) -> etree._Element:
        assert self.media_type in XML_TYPES, (self.media_type, self.body)
        root = etree.fromstring(self.body)
        assert local(root) == "restms"
        return root

    def elements(self) -> list[etree._Element]:
        return list(self.root())

    def top(self) -> etree._Element:
        """The single resource element directly under ``<restms>``."""
        elements = self.elements()
        assert len(elements) == 1, self.body
        return elements[0]

    def children(self, tag: str) -> list[etree._Element]:
        return [c for c in self.top() if local(c) == tag]

    def counts(self) -> list[str]:
        return [el.get("count") for el in self.elements()]

    def json(self) -> Any:
        assert self.media_type == JSON, self.media_type
        return json.loads(self.body)

    @property
    def etag(self) -> str:
        return self.headers["ETag"]

    @property
    def modified(self) -> float:
        return parsedate_to_datetime(self.headers["Last-Modified"]).timestamp()

    def assert_text_error(self, status: int) -> None:
        """This status, with the body every error has (S4)."""
        assert self.status == status, (self.status, self.body)
        self._assert_error_body()

    def assert_sane(self) -> None:
        """Never a 500 (503 is a wait or a full queue), and errors are plain text (S4)."""
        assert self.status < 500 or self.status == 503, (self.status, self.body)
        if self.status >= 400:
            self._assert_error_body()

    def _assert_error_body(self) -> None:
        """A short text/plain sentence: no markup, no JSON, never empty."""
        assert self.headers["Content-Type"].startswith("text/plain"), self.headers
        text = self.body.decode("utf-8").strip()
        assert text, "an error needs a reason"
        assert not text.lower().startswith(("<?xml", "<restms", "<html", "<!doctype")), text
        assert not looks_like_json(text), text


async def call(
    gw: Gateway,
    method: str,
    url: str,
    body: str | bytes | None = None,
    *,
    content_type: str | None = XML,
    **headers: str,
) -> Reply:
    """One request; ``content_type=None`` sends a body with no Content-Type at all.

    Header keyword names use ``_`` for ``-``. Absolute URIs may name another host (the
    U4 tests), so only their path is used: the request always goes to this gateway.
    """
    hdrs = {k.replace("_", "-"): v for k, v in headers.items()}
    skip: list[str] = []
    if body is not None:
        if content_type is None:
            skip.append("Content-Type")
        else:
            hdrs["Content-Type"] = content_type
    data = body.encode() if isinstance(body, str) else body
    target = URL(url, encoded=True)
    if target.is_absolute():
        target = URL(target.raw_path_qs, encoded=True)
    async with gw.http.request(
        method, target, data=data, headers=hdrs, skip_auto_headers=skip
    ) as r:
        return Reply(r.status, r.headers, await r.read())


def doc(inner: str, ns: str | None = NS) -> str:
    xmlns = f' xmlns="{ns}"' if ns else ""
    return f"<restms{xmlns}>{inner}</restms>"
