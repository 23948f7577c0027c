"""The first thing a new user does: discover the domain, make a pipe, publish, receive."""

from __future__ import annotations

from tests.conftest import Gateway

JSON = "application/restms+json"


async def test_housecat_round_trip_over_http(gw: Gateway) -> None:
    async with gw.http.get("/restms/domain/default") as r:
        assert r.status == 200
        assert "3/Defaults" in await r.text()
    async with gw.http.post(
        "/restms/domain/default",
        data=b'{"restms":{"pipe":[{}]}}',
        headers={"Content-Type": JSON, "Accept": JSON},
    ) as r:
        assert r.status == 201
        pipe = (await r.json(content_type=JSON))["restms"]["pipe"][0]
    asynclet = pipe["message"][-1]["href"]
    assert pipe["message"][-1]["async"] == "1"
    body = (
        f'<restms><message address="{pipe["name"]}">'
        '<content type="text/plain" encoding="plain">ping</content></message></restms>'
    )
    async with gw.http.post(
        "/restms/feed/default", data=body, headers={"Content-Type": "application/restms+xml"}
    ) as r:
        assert r.status == 200
        assert 'count="1"' in await r.text()
    async with gw.http.get(asynclet, headers={"Accept": JSON}) as r:
        assert r.status == 200
        message = (await r.json(content_type=JSON))["restms"]["message"][0]
    assert message["content"][0]["value"] == "ping"
