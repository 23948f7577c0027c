"""HTTPS end to end: a gateway started with ``tls_cert`` and ``tls_key``.

A test CA (trustme) issues a certificate for 127.0.0.1; its PEMs are written to
files, as an operator's would be. Decided behaviour under test:

* A client that trusts the CA reads and publishes over HTTPS; links in documents are
  ``https://`` links.
* A client that does not trust the CA fails verification.
* Plain HTTP to the TLS port gets no HTTP reply at all.
* TLS 1.1 and older are refused (the server's minimum is TLS 1.2).
* A certificate or key that cannot be loaded is a configuration error.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import warnings
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest
import trustme
import yarl

from gateway.server.config import ConfigError
from gateway.server.run import tls_context
from tests.app.jsonapi import DOMAIN, delete, get, join, new_pipe, post, publish
from tests.conftest import Gateway, MakeGateway

pytestmark = pytest.mark.app


@dataclass(frozen=True)
class Pki:
    cert: Path  # the server's certificate chain (PEM)
    key: Path  # its private key (PEM)
    trusting: ssl.SSLContext  # a client context that trusts the test CA, and only it


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    """A test CA and a server certificate for 127.0.0.1, written as PEM files."""
    ca = trustme.CA()
    leaf = ca.issue_cert("127.0.0.1")
    cert, key = tmp_path / "server.pem", tmp_path / "server.key"
    for blob in leaf.cert_chain_pems:
        blob.write_to_path(cert, append=True)
    leaf.private_key_pem.write_to_path(key)
    trusting = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ca.configure_trust(trusting)
    return Pki(cert=cert, key=key, trusting=trusting)


@pytest.fixture
async def tls_gw(make_gateway: MakeGateway, pki: Pki) -> Gateway:
    return await make_gateway(tls_cert=str(pki.cert), tls_key=str(pki.key), client_ssl=pki.trusting)


async def raw_tls(gw: Gateway, context: ssl.SSLContext) -> None:
    """Complete a TLS handshake with ``gw`` as ``context`` allows, then hang up."""
    url = yarl.URL(gw.url)
    _, writer = await asyncio.open_connection(
        url.host, url.port, ssl=context, server_hostname="127.0.0.1"
    )
    writer.close()
    with contextlib.suppress(ConnectionError, ssl.SSLError):
        await writer.wait_closed()


def unverified(version: ssl.TLSVersion) -> ssl.SSLContext:
    """A client context speaking exactly ``version``, not checking the certificate."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    context.minimum_version = context.maximum_version = version
    return context


async def test_https_with_the_ca_trusted(tls_gw: Gateway) -> None:
    assert tls_gw.url.startswith("https://127.0.0.1:")
    async with tls_gw.http.get(DOMAIN) as r:
        assert r.status == 200
        assert r.url.scheme == "https"
        assert "3/Defaults" in await r.text()


async def test_publish_and_read_round_trip_over_https(tls_gw: Gateway) -> None:
    status, reply, feed = await post(tls_gw, DOMAIN, feed=[{"name": "sealed", "type": "fanout"}])
    assert status == 201, reply
    assert feed.startswith("https://")
    pipe = await new_pipe(tls_gw)
    await join(tls_gw, pipe, feed)
    assert await publish(tls_gw, feed, {"content": [{"value": "over TLS"}]}) == [1]
    asynclet = pipe["message"][-1]["href"]
    assert asynclet.startswith(tls_gw.url)  # links name the scheme the client used
    status, reply = await get(tls_gw, asynclet)
    assert status == 200, reply
    (message,) = reply["restms"]["message"]
    assert message["content"][0]["value"] == "over TLS"
    assert await delete(tls_gw, asynclet) == 200  # acknowledged
    status, reply = await get(tls_gw, pipe["uri"])
    assert status == 200
    assert [m for m in reply["restms"]["pipe"][0]["message"] if not m.get("async")] == []


async def test_a_client_not_trusting_the_ca_fails_verification(tls_gw: Gateway) -> None:
    untrusting = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # verifies, trusts no CA at all
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=untrusting)) as http:
        with pytest.raises(aiohttp.ClientConnectorCertificateError):
            await http.get(tls_gw.uri(DOMAIN))


async def test_plain_http_to_the_tls_port_gets_no_http_reply(tls_gw: Gateway) -> None:
    url = yarl.URL(tls_gw.url)
    reader, writer = await asyncio.open_connection(url.host, url.port)
    writer.write(b"GET /restms/domain/default HTTP/1.1\r\nHost: gw\r\n\r\n")
    got = b""
    with contextlib.suppress(ConnectionError):
        async with asyncio.timeout(2):
            got = await reader.read()
    writer.close()
    assert b"HTTP/" not in got
    assert b"restms" not in got


async def test_tls_1_1_is_refused_and_1_2_accepted(tls_gw: Gateway, pki: Pki) -> None:
    await raw_tls(tls_gw, unverified(ssl.TLSVersion.TLSv1_2))  # the control
    # The server's own floor, whatever this runtime's clients can still speak.
    server = await asyncio.to_thread(tls_context, str(pki.cert), str(pki.key))
    assert server.minimum_version == ssl.TLSVersion.TLSv1_2
    with warnings.catch_warnings():  # deprecated, which is the point: an old client
        warnings.simplefilter("ignore", DeprecationWarning)
        old = unverified(ssl.TLSVersion.TLSv1_1)
    with contextlib.suppress(ssl.SSLError):
        old.set_ciphers("DEFAULT:@SECLEVEL=0")  # TLS 1.1 needs SHA-1 suites
    # Can this runtime's OpenSSL even say hello in TLS 1.1? Try it on a memory BIO.
    hello = old.wrap_bio(ssl.MemoryBIO(), ssl.MemoryBIO(), server_hostname="127.0.0.1")
    try:
        hello.do_handshake()
    except ssl.SSLWantReadError:
        pass  # it wrote a ClientHello and waits for the server: it can
    except ssl.SSLError:
        return  # this OpenSSL cannot say hello in TLS 1.1: the floor above is the check
    # The server's alert may or may not reach the client before the connection is
    # aborted: a protocol-version SSLError or a reset, either way no session. (Against a
    # server that allows TLS 1.1, this same client completes its handshake.)
    with pytest.raises((ssl.SSLError, ConnectionResetError)):
        await raw_tls(tls_gw, old)


def test_a_certificate_that_cannot_be_loaded_is_a_config_error(pki: Pki, tmp_path: Path) -> None:
    context = tls_context(str(pki.cert), str(pki.key))
    assert context.minimum_version == ssl.TLSVersion.TLSv1_2
    with pytest.raises(ConfigError, match="cannot load tls_cert"):
        tls_context(str(tmp_path / "missing.pem"), str(pki.key))
    stranger = tmp_path / "stranger.key"
    trustme.CA().issue_cert("127.0.0.1").private_key_pem.write_to_path(stranger)
    with pytest.raises(ConfigError, match="cannot load tls_cert"):
        tls_context(str(pki.cert), str(stranger))  # a key that is not the certificate's
