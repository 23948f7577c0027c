"""deploy/nginx.conf in front of a real gateway, as docs/OPERATIONS.md sets them up.

The site file is used as shipped, with only what a test machine must change: its
listening ports, the upstream's port, certificate and log paths (a test CA issues
the public certificate and the gateway's loopback one). nginx runs in the
foreground (scripts/services installs it). Decided behaviour under test:

* Through the proxy, documents name the public origin, ``https://`` and the public
  host: nginx passes ``Host`` and talks HTTPS to the gateway.
* A request relayed by the proxy is never a loopback guest, although nginx connects
  from 127.0.0.1 (it adds ``X-Forwarded-For``); with a token it is served.
* Server-Sent Events on a pipe arrive through the proxy as they are published (the
  site turns buffering off there, and the gateway's ``X-Accel-Buffering: no`` does
  too), and a WebSocket on a pipe is upgraded through it.
* A body over ``max_body`` is refused by nginx with 413, as the gateway would.
* The Containerfile's HEALTHCHECK command passes against a running gateway (plain
  and TLS) and fails where nothing listens.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import re
import shutil
import signal
import socket
import ssl
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest
import trustme
import yarl

from gateway.server.config import load
from tests.app.jsonapi import DOMAIN, get, new_pipe
from tests.app.oauth import clients, token
from tests.app.test_streams import SSE, event, message_of, send
from tests.app.test_websocket import PROTOCOL, expect, message
from tests.conftest import Gateway, MakeGateway

pytestmark = pytest.mark.app

ROOT = Path(__file__).resolve().parents[2]
PUBLIC = "restms.example.com"
SCOPES = "restms:read restms:publish restms:subscribe"


@dataclass(frozen=True)
class Files:
    """What the test machine provides in place of the site's paths."""

    directory: Path
    ca: trustme.CA
    public_port: int  # nginx's HTTPS port (the site's 443)
    plain_port: int  # nginx's HTTP port (the site's 80)
    gateway_cert: Path
    gateway_key: Path
    nginx: str  # the binary


def trusting(ca: trustme.CA) -> ssl.SSLContext:
    """A client context that trusts the test CA, and only it."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ca.configure_trust(context)
    return context


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture
def files(tmp_path: Path) -> Files:
    binary = shutil.which("nginx") or shutil.which("nginx", path="/usr/sbin:/sbin")
    if binary is None:
        pytest.fail("nginx is not installed: run scripts/services (it installs it as root)")
    ca = trustme.CA()
    public = ca.issue_cert(PUBLIC, "127.0.0.1")
    public.private_key_and_cert_chain_pem.write_to_path(str(tmp_path / "public.pem"))
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    loopback = ca.issue_cert("localhost", "127.0.0.1")
    loopback.cert_chain_pems[0].write_to_path(str(tmp_path / "gateway.pem"))
    loopback.private_key_pem.write_to_path(str(tmp_path / "gateway.key"))
    return Files(
        directory=tmp_path,
        ca=ca,
        public_port=free_port(),
        plain_port=free_port(),
        gateway_cert=tmp_path / "gateway.pem",
        gateway_key=tmp_path / "gateway.key",
        nginx=binary,
    )


def site_for_test(files: Files, upstream_port: int) -> str:
    """deploy/nginx.conf with this machine's ports, certificates and log paths."""
    site = (ROOT / "deploy" / "nginx.conf").read_text(encoding="utf-8")
    d = files.directory
    replaced = [
        (r"listen \[::\]:\d+[^;]*;", ""),
        (r"listen 80;", f"listen 127.0.0.1:{files.plain_port};"),
        (r"listen 443 ssl http2;", f"listen 127.0.0.1:{files.public_port} ssl http2;"),
        (r"server 127\.0\.0\.1:8443;", f"server 127.0.0.1:{upstream_port};"),
        (r"ssl_certificate\s+\S+;", f"ssl_certificate {d}/public.pem;"),
        (r"ssl_certificate_key\s+\S+;", f"ssl_certificate_key {d}/public.pem;"),
        (r"proxy_ssl_trusted_certificate\s+\S+;", f"proxy_ssl_trusted_certificate {d}/ca.pem;"),
        (r"/var/log/nginx/", f"{d}/"),
    ]
    for pattern, replacement in replaced:
        site, count = re.subn(pattern, replacement, site)
        assert count, pattern  # the shipped site still has what the test replaces
    return site


def main_conf(files: Files) -> str:
    d = files.directory
    temp = " ".join(
        f"{kind}_temp_path {d}/{kind};"
        for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
    )
    # As root, nginx's workers would become "nobody", who cannot read this directory.
    user = "user root;\n" if os.geteuid() == 0 else ""
    return (
        f"{user}daemon off;\nmaster_process on;\nworker_processes 1;\npid {d}/nginx.pid;\n"
        f"error_log {d}/error.log;\nevents {{ worker_connections 256; }}\n"
        f"http {{\n{temp}\naccess_log {d}/access.log;\ninclude {d}/site.conf;\n}}\n"
    )


async def port_open(port: int) -> bool:
    with contextlib.suppress(OSError):
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.close()
        await writer.wait_closed()
        return True
    return False


@contextlib.asynccontextmanager
async def nginx(files: Files, upstream_port: int) -> AsyncIterator[None]:
    d = files.directory
    site = await asyncio.to_thread(site_for_test, files, upstream_port)
    await asyncio.to_thread((d / "site.conf").write_text, site)
    await asyncio.to_thread((d / "nginx.conf").write_text, main_conf(files))
    process = await asyncio.create_subprocess_exec(
        files.nginx, "-p", str(d), "-c", str(d / "nginx.conf"), "-e", str(d / "error.log"),
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        for _ in range(100):  # 10 s at most
            if await port_open(files.public_port):
                break
            if process.returncode is not None:
                break
            await asyncio.sleep(0.1)
        else:
            pytest.fail("nginx did not listen within 10 s")
        if process.returncode is not None:
            assert process.stderr is not None
            pytest.fail(f"nginx exited: {(await process.stderr.read()).decode()}")
        yield
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(process.wait(), 10)
            except TimeoutError:
                process.kill()
                await process.wait()


@dataclass
class Setup:
    gw: Gateway  # talked to directly
    proxied: Gateway  # the same gateway, through nginx, as a client with a token
    anonymous: aiohttp.ClientSession  # through nginx, no credentials


@pytest.fixture
async def setup(make_gateway: MakeGateway, files: Files) -> AsyncIterator[Setup]:
    configured, secrets = await clients(app=SCOPES)
    production = await asyncio.to_thread(load, str(ROOT / "deploy" / "production.toml"), None, {})
    assert production.public_url == f"https://{PUBLIC}"
    gw = await make_gateway(
        clients=configured,
        tls_cert=str(files.gateway_cert),
        tls_key=str(files.gateway_key),
        client_ssl=trusting(files.ca),
        heartbeat=0.5,
        max_body=production.max_body,
        public_url=production.public_url,  # the issuer too
    )
    upstream = int(gw.url.rsplit(":", 1)[1])
    async with nginx(files, upstream):
        url = f"https://127.0.0.1:{files.public_port}"
        connector = aiohttp.TCPConnector(ssl=trusting(files.ca))
        headers = {"Host": PUBLIC}
        timeout = aiohttp.ClientTimeout(total=30)
        async with aiohttp.ClientSession(
            base_url=url, connector=connector, headers=headers, timeout=timeout
        ) as anonymous:
            via = Gateway(url=url, app=gw.app, http=anonymous)
            bearer = await token(via, "app", secrets["app"])
            async with aiohttp.ClientSession(
                base_url=url,
                connector=aiohttp.TCPConnector(ssl=trusting(files.ca)),
                headers={**headers, "Authorization": f"Bearer {bearer}"},
                timeout=timeout,
            ) as session:
                yield Setup(
                    gw=gw, proxied=Gateway(url=url, app=gw.app, http=session), anonymous=anonymous
                )


def path(uri: str) -> str:
    """The path of a public URI: the test reaches the proxy by address, not by name."""
    assert uri.startswith(f"https://{PUBLIC}/"), uri
    return yarl.URL(uri).path


async def test_documents_through_the_proxy_name_the_public_https_origin(setup: Setup) -> None:
    status, reply = await get(setup.proxied, DOMAIN)
    assert status == 200, reply
    hrefs = re.findall(r'"href":\s*"([^"]+)"', json.dumps(reply))
    ours = [h for h in hrefs if "restms.org" not in h]
    assert ours
    assert all(h.startswith(f"https://{PUBLIC}/") for h in ours), ours
    pipe = await new_pipe(setup.proxied)
    assert pipe["uri"].startswith(f"https://{PUBLIC}/restms/resource/")


async def test_a_relayed_request_without_credentials_is_not_a_guest(setup: Setup) -> None:
    # Directly from loopback the same request is the anonymous guest ...
    status, _ = await get(setup.gw, DOMAIN)
    assert status == 200
    # ... through the proxy, which also connects from 127.0.0.1, it is not.
    async with setup.anonymous.get(DOMAIN) as r:
        assert r.status == 401
        assert "Bearer" in r.headers.get("WWW-Authenticate", "")


async def test_server_sent_events_come_through_unbuffered(setup: Setup) -> None:
    pipe = await new_pipe(setup.proxied)
    async with setup.proxied.http.get(path(pipe["uri"]), headers=SSE) as r:
        assert r.status == 200, await r.text()
        assert r.headers["Content-Type"].startswith("text/event-stream")
        for value in ("first", "second"):  # each before the next is published
            await send(setup.proxied, pipe, value)
            found = await asyncio.wait_for(event(r), 5.0)
            assert message_of(found)["message_id"] == value


async def test_a_websocket_on_a_pipe_is_upgraded_through_the_proxy(setup: Setup) -> None:
    pipe = await new_pipe(setup.proxied)
    async with setup.proxied.http.ws_connect(path(pipe["uri"]), protocols=[PROTOCOL]) as ws:
        assert ws.protocol == PROTOCOL
        await send(setup.proxied, pipe, "over a socket")
        frame = await expect(ws, "message")
        assert message(frame)["message_id"] == "over a socket"


async def test_a_body_over_max_body_is_refused_by_the_proxy(setup: Setup) -> None:
    production = await asyncio.to_thread(load, str(ROOT / "deploy" / "production.toml"), None, {})
    big = io.BytesIO(b"x" * (production.max_body + 1))
    async with setup.proxied.http.post(
        "/restms/feed/default", data=big, headers={"Content-Type": "application/restms+json"}
    ) as r:
        assert r.status == 413
        assert r.headers.get("Server", "").startswith("nginx")


def healthcheck_script() -> str:
    """The Python the Containerfile's HEALTHCHECK runs."""
    text = (ROOT / "deploy" / "Containerfile").read_text(encoding="utf-8")
    line = re.search(r"^\s*CMD (\[\"python\", \"-c\".*\])$", text, re.M)
    assert line is not None
    argv = json.loads(line.group(1))
    return str(argv[2])


async def test_the_container_healthcheck_passes_against_a_running_gateway(
    make_gateway: MakeGateway, files: Files
) -> None:
    script = await asyncio.to_thread(healthcheck_script)
    plain = await make_gateway()
    tls = await make_gateway(
        tls_cert=str(files.gateway_cert),
        tls_key=str(files.gateway_key),
        data_dir=str(files.directory / "tls"),
    )
    for url, expected in (
        (plain.url, 0),
        (tls.url, 0),
        (f"http://127.0.0.1:{files.plain_port}", 1),
    ):
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-c", script,
            env={"RESTMS_HEALTH_URL": f"{url}/healthz"},
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
        )  # fmt: skip
        assert await asyncio.wait_for(process.wait(), 30) == expected, url
