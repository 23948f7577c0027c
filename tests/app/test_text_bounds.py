"""Free text over real HTTP: a title or license past restms.specs.MAX_TEXT is refused
with a 400 naming it, in XML and in JSON, before it can reach a listing."""

from __future__ import annotations

import io
import json

import pytest

from restms.specs import MAX_TEXT
from tests.app.oauth import DOMAIN, JSON
from tests.conftest import Gateway

pytestmark = pytest.mark.app

XML = "application/restms+xml"
NS = "http://www.restms.org/schema/restms"


def feed_body(fmt: str, **attrs: str) -> bytes:
    if fmt == JSON:
        return json.dumps({"restms": {"feed": [attrs]}}).encode()
    shown = "".join(f' {k}="{v}"' for k, v in attrs.items())
    return f'<restms xmlns="{NS}"><feed{shown}/></restms>'.encode()


@pytest.mark.parametrize("fmt", [XML, JSON])
async def test_a_long_title_or_license_is_400(gw: Gateway, fmt: str) -> None:
    """A title of 4 MiB (within max_body) would have made every domain listing 4 MB."""
    huge = "t" * (4 * 1024 * 1024 - 200)
    sent = {"Content-Type": fmt, "Accept": fmt}
    for attribute in ("title", "license"):
        body = feed_body(fmt, name="long", **{attribute: huge})
        async with gw.http.post(DOMAIN, data=io.BytesIO(body), headers=sent) as r:
            assert r.status == 400
            assert r.content_type == "text/plain"
            assert f"<feed> {attribute} is longer than {MAX_TEXT} characters" in await r.text()
    fits = "t" * MAX_TEXT
    body = feed_body(fmt, name="fits", title=fits, license=fits)
    async with gw.http.post(DOMAIN, data=body, headers=sent) as r:
        assert r.status == 201, await r.text()
        where = r.headers["Location"]
    async with gw.http.put(where, data=feed_body(fmt, title=fits + "t"), headers=sent) as r:
        assert r.status == 400
        assert "<feed> title is longer" in await r.text()
    async with gw.http.get(DOMAIN, headers={"Accept": JSON}) as r:
        listed = (await r.json())["restms"]["domain"][0]["feed"]
    assert {f["name"]: f["title"] for f in listed}["fits"] == fits
