"""The OpenAPI description is a contract: schemathesis against a live gateway.

Decided behaviour under test (docs/API.md, "The contract test"): for every operation
of ``GET /openapi.json``, as served by a real gateway on 127.0.0.1 (on the embedded
engine, and on the cluster engine in a namespace of the project's cluster), requests that
schemathesis generates from the description (valid ones and, for operations with
something to break, invalid ones), made as an ``restms:admin`` client (bearer token),
as the loopback guest (no credentials, and HTTP Basic ``guest``/``guest``) and with a
refused bearer token, get

* no 5xx answer;
* a status the operation documents;
* a ``Content-Type`` the operation documents for that status;
* a body that matches the schema documented for it, and the headers it requires.

Random path parameters mostly name nothing (404), so before each operation whose path
has parameters the test makes real resources as the admin client (a feed, a pipe
joined to it, a published message and its content, an extra OAuth client) and the
parameters are drawn from their names as well as generated: the documents, methods
and conditional headers schemathesis generates then reach real resources, and may
delete them (each operation gets fresh ones).

The run is bounded: ``EXAMPLES`` requests per operation and mode, each request at most
``REQUEST_TIMEOUT`` seconds, waits in the gateway capped at ``max_wait`` (so asynclets
and streams end), no shrinking. A failure names the operation, the check, and a curl
line to reproduce it; ``CONTRACT_SEED`` repeats a run (its seed is in the message).

The gateway runs in a thread with its own event loop, built as the app tests build
theirs (``build_app``, ``make_runner``, ``start_site``), under blockbuster: the
generated requests come from this thread with ``requests`` (schemathesis' transport),
and a blocking call on the gateway's loop fails the test. Analytics are off
(``analytics = false``: no Spark worker; ``/analytics/{query}`` is then a documented
503). Generated URLs (webhook callbacks, bridge brokers, federation remotes and token
endpoints) are pointed at 127.0.0.1 before they are sent, so nothing leaves this
machine: every authority (after ``//``, up to the first ``/ ? #``) becomes
``127.0.0.1:9``, once the tabs and line breaks URL parsers drop are gone (``http:\t//``
is ``http://`` to them), and a request in which urllib still finds another host is not
sent (the test fails).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import random
import re
import threading
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
import schemathesis
from blockbuster import blockbuster_ctx
from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis import checks as known_checks

from auth.clients import Client, hash_secret
from gateway.server.config import Config
from tests import nodes
from tests.cluster_state import redis_cluster
from tests.conftest import serve

# Generated requests per operation and generation mode (valid, invalid), without and
# with path parameters that name resources; CONTRACT_EXAMPLES scales both for a deeper
# run by hand (docs/API.md).
SCALE = float(os.environ.get("CONTRACT_EXAMPLES") or 1)
EXAMPLES = max(1, round(8 * SCALE))
EXAMPLES_ON_RESOURCES = max(1, round(20 * SCALE))
REQUEST_TIMEOUT = 10.0  # seconds a request may take (waits end after max_wait)
BUDGET = 200.0 * SCALE  # seconds the run may take (about 40 on two idle cores); then it fails
pytestmark = [pytest.mark.contract, pytest.mark.timeout(BUDGET + 100)]
__all__ = ["redis_cluster"]  # a fixture
CHECK_NAMES = (
    "status_code_conformance",
    "content_type_conformance",
    "response_headers_conformance",
    "response_schema_conformance",
)
ADMIN = "restms:admin"
SECRET = "contract-secret"
# What a live gateway under test is configured with: waits and streams end quickly,
# every request is answered (no rate limit), no Spark and no lake.
SETTINGS: dict[str, Any] = {
    "max_wait": 0.2,
    "stream_max": 0.2,
    "heartbeat": 0.5,
    "rate_limit": 0.0,
    "max_feeds_per_principal": 10_000,  # the admin client makes feeds for every operation
    "analytics": False,
    "mirror": False,
    "store_sync": "normal",
    "webhook_timeout": 1.0,
    "webhook_max_attempts": 1,
}
# The only 5xx answers allowed (each documented), by path template.
SERVER_ERRORS_ALLOWED = {
    "/analytics/{query}": {503},  # analytics are off: no Spark worker
    "/restms/resource/{hash}": {503},  # an asynclet's wait ended with nothing (A9: retry)
}
JSON = "application/restms+json"
RESOURCE = re.compile(r"/restms/resource/([^/?#\s\"]+)")
# An authority: after two slashes (or backslashes, which WHATWG parsers read as slashes),
# up to the first / ? or #, whitespace included, so nothing glued to it survives.
AUTHORITY = re.compile(r"[/\\]{2}[^/?#]*")
DROPPED = re.compile(r"[\t\r\n]")  # what urllib, yarl and WHATWG parsers remove first
LOOPBACK = "127.0.0.1"


@contextlib.contextmanager
def live_gateway(data_dir: Path, clients: tuple[Client, ...], engine: str) -> Iterator[str]:
    """A gateway on 127.0.0.1 in a thread of its own (its own loop), on ``engine``
    (the cluster's in a namespace of its own, deleted after); yields its URL."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="contract-gateway", daemon=True)
    thread.start()
    shared: dict[str, Any] = {}
    if engine == "redis":
        shared = {"engine": "redis", "redis_url": nodes.CLUSTER_URL}
        shared["redis_namespace"] = nodes.namespace()
    config = Config(port=0, data_dir=str(data_dir), clients=clients, **SETTINGS, **shared)
    try:
        _, runner, url = asyncio.run_coroutine_threadsafe(serve(config), loop).result(60)
        try:
            yield url
        finally:
            asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(60)
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()
        if shared:
            asyncio.run(nodes.forget(shared["redis_namespace"]))


def admin_token(url: str) -> str:
    basic = base64.b64encode(f"admin:{SECRET}".encode()).decode()
    reply = requests.post(
        url + "/oauth/token",
        data={"grant_type": "client_credentials"},
        headers={"Authorization": f"Basic {basic}"},
        timeout=REQUEST_TIMEOUT,
    )
    assert reply.status_code == 200, reply.text
    return str(reply.json()["access_token"])


def make_resources(url: str, auth: dict[str, str], n: int, path: str) -> dict[str, list[str]]:
    """Fresh resources as the admin client for one path template; parameter -> names."""
    http = requests.Session()
    http.headers.update({**auth, "Accept": JSON})

    def post(uri: str, **document: Any) -> requests.Response:
        reply = http.post(
            uri, json={"restms": document}, headers={"Content-Type": JSON}, timeout=REQUEST_TIMEOUT
        )
        assert reply.status_code in (200, 201), (uri, reply.status_code, reply.text)
        return reply

    domain = url + "/restms/domain/default"
    feed = f"contract-{n}"
    post(domain, feed=[{"name": feed, "type": "fanout"}])
    pipe = post(domain, pipe=[{}]).headers["Location"]
    post(pipe, join=[{"feed": f"{url}/restms/feed/{feed}", "address": ""}])
    content = {"type": "text/plain", "value": "x"}
    post(f"{url}/restms/feed/{feed}", message=[{"address": "a", "content": [content]}])
    seen = set(RESOURCE.findall(http.get(pipe, timeout=REQUEST_TIMEOUT).text))
    for name in list(seen):  # the message's contents
        seen |= set(RESOURCE.findall(http.get(f"{url}/restms/resource/{name}").text))
    client = f"contract-{n}"
    if path == "/admin/clients/{id}":  # a secret hashed with scrypt: only where needed
        reply = http.post(
            url + "/admin/clients",
            json={"client_id": client, "scopes": ["restms:read"]},
            timeout=REQUEST_TIMEOUT,
        )
        assert reply.status_code == 201, reply.text
    pipe_name = pipe.rsplit("/", 1)[1]
    http.close()
    names = {
        "/restms/domain/{name}": {"name": ["default"]},
        "/restms/feed/{name}": {"name": [feed, "default"]},
        "/restms/resource/{hash}": {"hash": sorted(seen)},
        "/admin/pipes/{name}": {"name": [pipe_name]},
        "/admin/pipes/{name}/messages": {"name": [pipe_name]},
        "/admin/clients/{id}": {"id": [client]},
    }
    return names.get(path, {})


def local(value: Any) -> Any:
    """The value with every URL's authority turned into 127.0.0.1:9 (nothing listens);
    strings with no authority are left as they are."""
    if isinstance(value, str):
        bare = DROPPED.sub("", value)
        if not AUTHORITY.search(bare):
            return value
        return AUTHORITY.sub(f"//{LOOPBACK}:9", bare)
    if isinstance(value, dict):
        return {k: local(v) for k, v in value.items()}
    if isinstance(value, list):
        return [local(v) for v in value]
    return value


def foreign_hosts(value: Any) -> list[str]:
    """The hosts other than 127.0.0.1 that urllib (what the gateway checks URLs with)
    finds in the strings of ``value``: none once :func:`local` has passed over it."""
    if isinstance(value, str):
        try:
            host = urllib.parse.urlsplit(value).hostname
        except ValueError:  # not a URL, to the gateway either
            return []
        return [host] if host not in (None, LOOPBACK) else []
    if isinstance(value, dict):
        return [h for v in value.values() for h in foreign_hosts(v)]
    if isinstance(value, list):
        return [h for v in value for h in foreign_hosts(v)]
    return []


@pytest.mark.parametrize("engine", ["embedded", "redis"])
def test_every_operation_answers_as_described(
    engine: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    if engine == "redis":
        request.getfixturevalue("redis_cluster")  # the project's cluster, brought up
    run_seed = int(os.environ.get("CONTRACT_SEED") or random.randrange(2**32))
    secret_hash = hash_secret(SECRET)
    clients = (Client(client_id="admin", secret_hash=secret_hash, scopes=(ADMIN,)),)
    checks = [getattr(known_checks, name) for name in CHECK_NAMES]
    failures: list[str] = []
    started = time.monotonic()
    with blockbuster_ctx(), live_gateway(tmp_path / "var", clients, engine) as url:
        callers = {
            "admin": {"Authorization": f"Bearer {admin_token(url)}"},
            "guest": {},
            "basic": {"Authorization": "Basic " + base64.b64encode(b"guest:guest").decode()},
            "refused": {"Authorization": "Bearer not-a-token"},
        }
        schema = schemathesis.openapi.from_url(url + "/openapi.json")
        assert schema.raw_schema["openapi"].startswith("3.1.")
        session = requests.Session()
        operations = [result.ok() for result in schema.get_all_operations()]
        assert len(operations) >= 40, len(operations)
        for n, operation in enumerate(operations):
            known = {}
            if "{" in operation.path:
                known = make_resources(url, callers["admin"], n, operation.path)
            fixed = [{}] + [{k: v} for k, values in known.items() for v in values]
            # Nothing is dropped: an operation with nothing to break still gets a
            # negative strategy (schemathesis rejects the drawn cases that negate
            # nothing), so a strategy that cannot be built fails its operation.
            try:
                strategies = [
                    operation.as_strategy(mode, path_parameters=path_parameters or None)
                    for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)
                    for path_parameters in fixed
                ]
            except Exception as exc:  # every operation is tried; this one fails
                failures.append(f"{operation.label}: no strategy: {exc!r}")
                continue
            examples = EXAMPLES_ON_RESOURCES if known else EXAMPLES

            @seed(run_seed)
            @settings(
                max_examples=examples * 2,
                deadline=None,  # each request is bounded by REQUEST_TIMEOUT instead
                database=None,
                phases=[Phase.explicit, Phase.generate],
                suppress_health_check=list(HealthCheck),
            )
            @given(case=st.one_of(strategies), caller=st.sampled_from(sorted(callers)))
            def exercise(case: Any, caller: str) -> None:
                case.body = local(case.body)
                case.query = local(case.query)
                escaped = foreign_hosts(case.body) + foreign_hosts(case.query)
                assert not escaped, f"generated URLs not made local: {escaped}"
                response = case.call(
                    base_url=url,
                    session=session,
                    headers=callers[caller],
                    timeout=REQUEST_TIMEOUT,
                    allow_redirects=False,
                )
                allowed = SERVER_ERRORS_ALLOWED.get(case.operation.path, set())
                assert response.status_code < 500 or response.status_code in allowed, (
                    f"{response.status_code} {response.text[:300]!r}\n{case.as_curl_command()}"
                )
                case.validate_response(response, checks=checks, headers=callers[caller])

            try:
                exercise()
            except (Exception, BaseExceptionGroup) as exc:  # every operation is tried
                failures.append(f"{operation.label}: {exc}")
            assert time.monotonic() - started < BUDGET, (
                f"the contract run took over {BUDGET} s (at {operation.label})"
            )
        session.close()
    assert not failures, f"seed {run_seed}; {len(failures)} failing:\n\n" + "\n\n".join(failures)
