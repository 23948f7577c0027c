"""Benchmark 8: what authentication costs a single publish, req/s with and without it.

One gateway process serves every variant, so the only difference between them is the
``Authorization`` header that wrk sends (``-H``) on every request:

* ``guest``: no header; a loopback request without credentials acts as ``guest``
  (the baseline);
* ``bearer``: ``Bearer <JWT>`` from the built-in authorization server, the same token
  on every request: after its first verification the gateway answers it from its cache
  of verified tokens, which is the designed steady state;
* ``basic``: ``Basic guest:guest``, the built-in loopback guest login (for information).

Before the gateway starts, ``main.py client add`` puts a client into its data
directory; the token comes from ``POST /oauth/token`` (client credentials, HTTP Basic).
The gateway runs with ``RESTMS_RATE_LIMIT=0`` (the per-principal limit would throttle
the load) and ``RESTMS_TOKEN_TTL=3600`` (the token outlives the run). The body, content
type and wrk settings are those of benchmark 1 (one 1 KiB XML message per POST, 32
connections), and each run publishes to a fresh fanout feed with one joined pipe,
deleted afterwards. A round gives each variant ``duration`` seconds of load, cut into
1 s wrk runs (slices) that take turns, the order rotating every slice, so a burst of
load from elsewhere on the shared machine falls on all variants alike. The figure that
counts is the median over rounds of each round's ratio to that round's guest req/s.
Any non-2xx reply fails the benchmark: a refused token would be answered faster than a
publish and would flatter the figure.

For reference, :func:`middleware_cost` also times the authenticator's own work per
request in this process (no HTTP), and one full JWT verification.
"""

from __future__ import annotations

import base64
import json
import re
import resource
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import uvloop

from bench import rest, throughput
from bench.common import (
    PYTHON,
    ROOT,
    XML,
    Server,
    cpu_seconds,
    log,
    machine_busy,
    median,
    start,
    system_ticks,
)

CLIENT = "bench"
SCOPES = "restms:read restms:publish restms:subscribe"
TOKEN_TTL = 3600
VARIANTS = ("guest", "bearer", "basic")
BASELINE = "guest"
TARGET = 0.85  # bearer req/s at least this share of guest req/s (cost <= 15 %)
SLICE = 1  # seconds per wrk run: a round's time per variant is cut into such slices


def add_client(data_dir: str) -> str:
    """``main.py client add`` into ``data_dir``; its secret (printed once)."""
    argv = [PYTHON, str(ROOT / "main.py"), "client", "add", CLIENT, "--scopes", SCOPES]
    argv += ["--data-dir", data_dir]
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=60, check=False)
    found = re.search(r"^client_secret: (\S+)$", done.stdout, re.MULTILINE)
    if done.returncode != 0 or found is None:
        raise RuntimeError(f"client add failed ({done.returncode}): {done.stdout}{done.stderr}")
    return found.group(1)


async def fetch_token(base: str, secret: str) -> dict[str, Any]:
    """An access token for the client (the token endpoint's JSON reply)."""
    async with (
        aiohttp.ClientSession() as http,
        http.post(
            f"{base}/oauth/token",
            data={"grant_type": "client_credentials"},
            auth=aiohttp.BasicAuth(CLIENT, secret),
        ) as reply,
    ):
        body = await reply.read()
        if reply.status != 200:
            raise RuntimeError(f"token endpoint -> {reply.status}: {body[:300]!r}")
        answer: dict[str, Any] = json.loads(body)
        return answer


async def check_variant(base: str, feed_name: str, header: dict[str, str], body: bytes) -> None:
    """One publish with the variant's header must be accepted and reach the joined pipe."""
    fixture = await rest.fanout_fixture(base, feed_name)
    try:
        async with (
            aiohttp.ClientSession() as http,
            http.post(fixture["feed"], data=body, headers={"Content-Type": XML, **header}) as reply,
        ):
            text = await reply.text()
            if reply.status != 200 or 'count="1"' not in text:
                raise RuntimeError(f"publish with {header} -> {reply.status}: {text[:300]}")
    finally:
        await rest.drop_fixture(base, fixture)


def wrk_with_headers(
    server: Server, url: str, body: Path, headers: dict[str, str], seconds: int
) -> dict[str, Any]:
    """One wrk run of benchmark 1's settings plus ``-H`` headers, with CPU used meanwhile."""
    _, content_type, _, connections = throughput.cases()["single"]
    extra = [arg for name, value in headers.items() for arg in ("-H", f"{name}: {value}")]
    argv = [throughput.ensure_wrk(), "-t1", f"-c{connections}", f"-d{seconds}s"]
    argv += [*extra, "--timeout", "10s", "-s", str(throughput.LUA), url]
    argv += ["--", str(body), content_type]
    ticks0, cpu0 = system_ticks(), cpu_seconds(server.pid)
    kids0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    done = subprocess.run(argv, capture_output=True, text=True, timeout=seconds + 60, check=False)
    wall = time.monotonic() - t0
    cpu, ticks1 = cpu_seconds(server.pid) - cpu0, system_ticks()
    kids1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    summary = next((x for x in done.stdout.splitlines() if x.startswith("WRKJSON ")), "")
    if done.returncode != 0 or not summary:
        raise RuntimeError(f"wrk failed ({done.returncode}): {done.stdout}\n{done.stderr}")
    stats = json.loads(summary.removeprefix("WRKJSON "))
    return {
        "requests": stats["requests"],
        "seconds": stats["duration_us"] / 1e6,
        "errors": sum(stats[k] for k in ("connect", "read", "write", "status", "timeout")),
        "non_2xx": stats["status"],
        "latency_p50_ms": stats["lat_p50_us"] / 1000,
        "latency_p99_ms": stats["lat_p99_us"] / 1000,
        "wall_s": wall,
        "server_cpu_s": cpu,
        "wrk_cpu_s": kids1.ru_utime + kids1.ru_stime - kids0.ru_utime - kids0.ru_stime,
        "machine_busy": machine_busy(ticks0, ticks1),
        "alive_after": server.alive(),
    }


def measure(
    server: Server, headers: dict[str, str], body: Path, seconds: int, feed_name: str
) -> dict[str, Any]:
    """One slice: a fresh fixture, one wrk run, the fixture dropped; errors are fatal."""
    fixture = uvloop.run(rest.fanout_fixture(server.base, feed_name))
    try:
        result = wrk_with_headers(server, fixture["feed"], body, headers, seconds)
    finally:
        if server.alive():
            uvloop.run(rest.drop_fixture(server.base, fixture))
    if result["errors"] or not result["alive_after"]:
        raise RuntimeError(f"run with {list(headers)} had errors: {result}")
    return result


def combine(slices: list[dict[str, Any]]) -> dict[str, Any]:
    """A variant's figures for one round, from its slices (summed, then divided)."""
    requests = sum(x["requests"] for x in slices)
    seconds, wall = sum(x["seconds"] for x in slices), sum(x["wall_s"] for x in slices)
    cpu = sum(x["server_cpu_s"] for x in slices)
    return {
        "requests": requests,
        "seconds": seconds,
        "req_per_s": requests / seconds,
        "server_cpu_util": cpu / wall,
        "server_cpu_us_per_req": cpu / requests * 1e6 if requests else None,
        "wrk_cpu_util": sum(x["wrk_cpu_s"] for x in slices) / wall,
        "machine_busy": median([x["machine_busy"] for x in slices]),
        "latency_p50_ms": median([x["latency_p50_ms"] for x in slices]),
        "errors": sum(x["errors"] for x in slices),
        "slices": slices,
    }


def ratios(out: dict[str, list[dict[str, Any]]], variant: str, key: str) -> list[float]:
    """Per round: the variant's req/s over the same round's guest req/s (``req_per_s``),
    or guest's server CPU per request over the variant's (``server_cpu_us_per_req``:
    req per server CPU-second, less sensitive to what else the machine is doing)."""
    pairs = zip(out[variant], out[BASELINE], strict=True)
    if key == "req_per_s":
        return [r[key] / g[key] for r, g in pairs if g[key]]
    return [g[key] / r[key] for r, g in pairs if r[key]]


async def _per_call_us(call: Any, count: int) -> float:
    """Best of five: microseconds per ``await call()``."""
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(count):
            await call()
        best = min(best, (time.perf_counter() - t0) / count * 1e6)
    return best


async def middleware_cost(count: int = 20_000) -> dict[str, float]:
    """In this process, microseconds per request of the authentication middleware's own
    work (``Authenticator.principal`` + ``take``) for each variant, with the gateway's
    settings of this benchmark, plus one full JWT verification (what a token's first
    request pays before it is cached). Not an HTTP figure: it is the part of each
    request's server time that authentication adds, free of the machine's noise."""
    from joserfc.jwk import ECKey

    from auth.clients import Client
    from auth.issuer import Issuer, SigningKey
    from auth.tokens import JwtVerifier, TrustedIssuer, Verifier
    from gateway.auth.authn import Authenticator
    from gateway.server.config import load

    config = load(env={}, overrides={"rate_limit": 0, "token_ttl": TOKEN_TTL})
    key = SigningKey(ECKey.generate_key("P-256", private=True))
    issuer = Issuer("http://127.0.0.1:0", config.audience, key, config.token_ttl)
    client = Client(client_id=CLIENT, secret_hash="unused", scopes=tuple(SCOPES.split()))
    token = issuer.token(client, None)["access_token"]

    async def no_fetch(url: str) -> bytes:
        raise OSError(f"no JWKS fetch in this benchmark: {url}")

    trusted = TrustedIssuer(issuer=issuer.issuer, audience=config.audience, keys=key.public_jwks())
    jwt = JwtVerifier([trusted], no_fetch, leeway=config.token_leeway)
    authenticator = Authenticator(config)
    authenticator.verifier = Verifier(jwt, None, cache_size=config.token_cache)
    authenticator.prefixes[issuer.issuer] = ""
    basic = base64.b64encode(b"guest:guest").decode()
    headers = {"guest": None, "bearer": f"Bearer {token}", "basic": f"Basic {basic}"}
    out: dict[str, float] = {}
    for variant, header in headers.items():

        async def request(header: str | None = header) -> None:
            authenticator.take(await authenticator.principal(header, "127.0.0.1"))

        await request()  # warm-up; for the bearer token, its first (uncached) check
        out[f"{variant}_us"] = await _per_call_us(request, count)

    async def verify() -> None:
        await jwt.verify(token)

    out["jwt_verify_us"] = await _per_call_us(verify, max(1, count // 100))
    return out


def run(env: dict[str, str], rounds: int, duration: float) -> dict[str, Any]:
    """Start a gateway with a client, take a token, then the rounds (see the module doc)."""
    data_dir = tempfile.mkdtemp(prefix="restms-bench-auth-")
    gateway_env = {**env, "RESTMS_RATE_LIMIT": "0", "RESTMS_TOKEN_TTL": str(TOKEN_TTL)}
    try:
        secret = add_client(data_dir)
        gateway = start("gateway", gateway_env, data_dir=data_dir)
        try:
            out = _rounds(gateway, secret, rounds, duration)
        finally:
            gateway.stop()
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)
    out["in_process"] = cost = uvloop.run(middleware_cost())
    log("  in process, us per request: " + ", ".join(f"{k} {v:.2f}" for k, v in cost.items()))
    return out


def _rounds(gateway: Server, secret: str, rounds: int, duration: float) -> dict[str, Any]:
    slice_count = max(1, round(duration / SLICE))  # per variant per round
    token = uvloop.run(fetch_token(gateway.base, secret))
    if token.get("expires_in", 0) < rounds * slice_count * len(VARIANTS) * (SLICE + 2) + 60:
        raise RuntimeError(f"token expires before the run ends: {token.get('expires_in')}")
    basic = base64.b64encode(b"guest:guest").decode()
    headers = {
        "guest": {},
        "bearer": {"Authorization": f"Bearer {token['access_token']}"},
        "basic": {"Authorization": f"Basic {basic}"},
    }
    out: dict[str, Any] = {v: [] for v in VARIANTS}
    body_bytes = throughput.cases()["single"][0]
    with tempfile.TemporaryDirectory(prefix="restms-bench-bodies-") as tmp:
        body = Path(tmp) / "single.body"
        body.write_bytes(body_bytes)
        for variant in VARIANTS:  # accepted, delivered; then a short unrecorded warm-up
            uvloop.run(check_variant(gateway.base, f"check{variant}", headers[variant], body_bytes))
            measure(gateway, headers[variant], body, 1, f"warm{variant}")
        serial = 0
        for round_no in range(rounds):
            slices: dict[str, list[dict[str, Any]]] = {v: [] for v in VARIANTS}
            for slice_no in range(slice_count):  # the order rotates every slice
                shift = (round_no * slice_count + slice_no) % len(VARIANTS)
                for variant in VARIANTS[shift:] + VARIANTS[:shift]:
                    serial += 1
                    one = measure(gateway, headers[variant], body, SLICE, f"a{serial}")
                    slices[variant].append(one)
            for variant in VARIANTS:
                result = combine(slices[variant])
                result["round"], result["variant"] = round_no, variant
                out[variant].append(result)
                log(
                    f"  round {round_no + 1}/{rounds} {variant:6s} {result['req_per_s']:8.0f} "
                    f"req/s  server {result['server_cpu_us_per_req']:6.1f} CPU-us/req "
                    f"cpu={result['server_cpu_util']:.2f} busy={result['machine_busy']:.0%}"
                )
    for variant in VARIANTS:
        if variant != BASELINE:
            per_round = ratios(out, variant, "req_per_s")
            out[f"{variant}_ratios"] = per_round
            out[f"{variant}_ratio"] = median(per_round)
            per_cpu = ratios(out, variant, "server_cpu_us_per_req")
            out[f"{variant}_cpu_ratios"] = per_cpu
            out[f"{variant}_cpu_ratio"] = median(per_cpu)
    out["slices_per_round"], out["slice_s"] = slice_count, SLICE
    out["token_bytes"] = len(token["access_token"])
    out["body_bytes"] = len(body_bytes)
    out["target"] = TARGET
    log(
        f"  bearer/guest per round: {' '.join(f'{x:.3f}' for x in out['bearer_ratios'])}; "
        f"median {out['bearer_ratio']:.3f} (target >= {TARGET}); per server CPU-second "
        f"{out['bearer_cpu_ratio']:.3f}"
    )
    return out
