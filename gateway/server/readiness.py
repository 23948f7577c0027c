"""``GET /readyz``: may a load balancer send this gateway traffic? (docs/METRICS.md)

``/healthz`` answers whenever the process does (liveness). ``/readyz`` answers 200
``ready`` or 503 ``not ready``, ``text/plain``, with one line per reason and one per
thing it looked at. Not ready when:

* shutdown has begun (new requests would be refused anyway; the middleware answers
  503 before this handler once it has, this check covers the moment in between);
* the store (``store = "sqlite"``) has no writer thread, or a test transaction (an
  empty one: no page is written) fails or is not committed within
  ``ready_commit_timeout`` seconds: publishes of persistent messages would fail or
  hang. The probe is also how a store whose last transaction failed shows that it
  commits again;
* with ``ready_needs_bridges``, a bridge whose link is not ``up``;
* with ``ready_needs_analytics``, an analytics worker that is not ``ready``.

Bridges and the analytics worker (which starts in the background and may take a
minute) do not decide by default: a broker or peer that is away does not stop the
gateway serving HTTP (outbound messages wait in the bridge's pipe, bounded, and are
sent when the link is back), and taking every gateway out of a load balancer because
one broker is down would turn a partial outage into a full one. Their states are
listed either way. The engine service answers for itself (shutting down, the store's
test transaction, which concurrent probes share: ``EngineService.readiness``).
"""

from __future__ import annotations

from aiohttp import web

from gateway.admin.analytics import ANALYTICS
from gateway.admin.bridging import BRIDGES
from gateway.server.keys import CONFIG, SERVICE

PATH = "/readyz"


async def readyz(request: web.Request) -> web.Response:
    app = request.app
    config = app[CONFIG]
    ready = await app[SERVICE].readiness(config.ready_commit_timeout)
    reasons, seen = list(ready.problems), list(ready.checked)
    for bridge in app[BRIDGES]:
        state = bridge.status()["state"]
        line = f"bridge {bridge.name}: {state}"
        (reasons if state != "up" and config.ready_needs_bridges else seen).append(line)
    analytics = app[ANALYTICS]
    if analytics.enabled:  # the worker's state, for information unless configured
        worker = analytics.worker.status()
        line = f"analytics worker: {worker['state']} since {worker['since']}"
        (reasons if worker["state"] != "ready" and config.ready_needs_analytics else seen).append(
            line
        )
    else:
        seen.append("analytics: off")
    lines = ["not ready" if reasons else "ready", *reasons, *seen]
    return web.Response(
        status=503 if reasons else 200,
        text="\n".join(lines) + "\n",
        headers={"Cache-Control": "no-store"},
    )


def add_routes(app: web.Application) -> None:
    app.router.add_get(PATH, readyz)
