"""Benchmark 4: gateway RSS with 10,000 concurrent waiting asynclets, then a fan-out to all.

Per round, on a freshly started gateway:

1. create a fanout feed, then N default-type pipes and N joins (feed -> pipe), with
   bounded concurrency, and note how long that took;
2. read the gateway's VmRSS (``before``);
3. start ``asynclet_client.py wait`` in a separate process: N concurrent GETs, one
   per pipe asynclet, each on its own connection (aiohttp connector limit=0);
4. once every GET is written and the gateway holds N sockets, sample VmRSS until it
   settles (``while``); extra = while - before;
5. publish one message to the fanout feed (the reply must say ``count="N"``) and
   wait until the client has counted N replies that are 200 and carry the
   message's tag; report the time from just before the publish to the last reply.

Baseline, per round, on a freshly started bare server: VmRSS before and while the
same client holds N idle keep-alive connections (one finished POST each). That is
the cost of N open aiohttp connections with no RestMS state at all.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import select
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import uvloop

from bench import rest
from bench.common import (
    BENCH,
    PYTHON,
    ROOT,
    log,
    median,
    open_fds,
    rss_mb,
    start,
    xml_messages,
)

# One principal (the loopback guest) makes 10,000 pipes and joins and holds 10,000
# asynclets open from one address: the gateway's abuse limits, which a real deployment
# keeps (docs/AUTH.md), are lifted for it. Without this the run fails at the first of
# them with a 403 or a 429 (it did once per-principal quotas came in).
ABUSE_LIMITS = {
    "RESTMS_RATE_LIMIT": "0",
    "RESTMS_MAX_PIPES_PER_PRINCIPAL": "20000",
    "RESTMS_MAX_JOINS_PER_PRINCIPAL": "40000",
    "RESTMS_MAX_WAITS_PER_PRINCIPAL": "20000",
    "RESTMS_MAX_CONNECTIONS_PER_IP": "20000",
    "RESTMS_MAX_CONNECTIONS": "20000",
}

CLIENT = BENCH / "asynclet_client.py"


def _read_event(proc: subprocess.Popen[str], timeout: float) -> dict[str, Any]:
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stdout], [], [], 0.5)
        if ready:
            line = proc.stdout.readline()
            if not line:
                raise RuntimeError(f"client exited ({proc.poll()}) without reporting")
            return json.loads(line)
        if proc.poll() is not None:
            raise RuntimeError(f"client exited with {proc.returncode}")
    raise TimeoutError(f"client did not report within {timeout}s")


def _quiet_rss(pid: int) -> float:
    """The median of three VmRSS readings 0.2 s apart."""
    samples = []
    for _ in range(3):
        samples.append(rss_mb(pid))
        time.sleep(0.2)
    return median(samples) or 0.0


def _settled_rss(pid: int, want_fds: int, limit: float = 15.0) -> dict[str, Any]:
    """Sample VmRSS every 0.5 s until the socket count is reached and RSS stops moving."""
    samples: list[float] = []
    deadline = time.monotonic() + limit
    fds = 0
    while time.monotonic() < deadline:
        fds = open_fds(pid)
        samples.append(rss_mb(pid))
        if fds >= want_fds and len(samples) >= 3 and abs(samples[-1] - samples[-2]) < 0.5:
            break
        time.sleep(0.5)
    return {"rss_mb": samples[-1], "max_mb": max(samples), "samples": samples, "fds": fds}


async def _make_pipes(base: str, feed_name: str, count: int, concurrency: int) -> dict[str, Any]:
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector) as http:
        feed = await rest.create_feed(http, base, feed_name)
        gate = asyncio.Semaphore(concurrency)

        async def pipe() -> tuple[str, str]:
            async with gate:
                return await rest.create_pipe(http, base)

        async def link(pipe_uri: str) -> None:
            async with gate:
                await rest.join(http, pipe_uri, feed)

        t0 = time.monotonic()
        pipes = await asyncio.gather(*(pipe() for _ in range(count)))
        t1 = time.monotonic()
        await asyncio.gather(*(link(p) for p, _ in pipes))
        t2 = time.monotonic()
    return {
        "feed": feed,
        "asynclets": [a for _, a in pipes],
        "create_pipes_s": t1 - t0,
        "create_joins_s": t2 - t1,
    }


async def _publish(feed: str, body: bytes) -> str:
    async with aiohttp.ClientSession() as http:
        return await rest.publish(http, feed, body)


def _stop_client(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def gateway_round(
    count: int, round_no: int, *, root: Path = ROOT, name: str | None = None
) -> dict[str, Any]:
    """One round on a fresh gateway of the checkout ``root`` (its log: ``name``)."""
    gateway = start("gateway", ABUSE_LIMITS, root=root, name=name)
    proc = None
    try:
        made = uvloop.run(_make_pipes(gateway.base, f"wide{round_no}", count, 64))
        log(
            f"  round {round_no + 1}: {count} pipes in {made['create_pipes_s']:.1f} s, "
            f"{count} joins in {made['create_joins_s']:.1f} s"
        )
        with tempfile.NamedTemporaryFile("w", suffix=".urls", delete=False) as f:
            f.write("\n".join(made["asynclets"]))
            urls = f.name
        time.sleep(1.0)
        before = _quiet_rss(gateway.pid)
        fds_before = open_fds(gateway.pid)
        tag = f"fanout-{round_no}-{time.time_ns()}"
        proc = subprocess.Popen(
            [PYTHON, str(CLIENT), "wait", "--urls", urls, "--expect", tag],
            stdout=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
        )
        sent = _read_event(proc, 120)
        waiting = _settled_rss(gateway.pid, fds_before + count)
        if sent["sent"] != count:
            raise RuntimeError(f"client wrote only {sent['sent']} of {count} GETs: {sent}")
        t0 = time.monotonic()
        reply = uvloop.run(_publish(made["feed"], xml_messages(1, tag=tag)))
        t_reply = time.monotonic()
        done = _read_event(proc, 120)
        proc.wait(30)
        Path(urls).unlink()
        delivered_s = (done["last_t"] - t0) if done["last_t"] else None
        result = {
            "round": round_no,
            "pipes": count,
            "create_pipes_s": made["create_pipes_s"],
            "create_joins_s": made["create_joins_s"],
            "rss_before_mb": before,
            "rss_waiting_mb": waiting["rss_mb"],
            "rss_waiting_max_mb": waiting["max_mb"],
            "rss_samples_mb": waiting["samples"],
            "extra_mb": waiting["rss_mb"] - before,
            "gateway_fds_before": fds_before,
            "gateway_fds_waiting": waiting["fds"],
            "open_requests_s": sent["seconds"],
            "publish_reply_count_ok": f'count="{count}"' in reply,
            "publish_reply_s": t_reply - t0,
            "received_ok": done["ok"],
            "received_bad": done["bad"],
            "errors": done["errors"],
            "all_delivered_s": delivered_s,
            "first_delivered_s": (done["first_t"] - t0) if done["first_t"] else None,
            "rss_after_mb": rss_mb(gateway.pid),
            "alive_after": gateway.alive(),
        }
        log(
            f"  round {round_no + 1}: gateway RSS {before:.1f} -> {waiting['rss_mb']:.1f} MB "
            f"(+{result['extra_mb']:.1f}), {done['ok']}/{count} delivered "
            f"in {delivered_s if delivered_s is None else round(delivered_s, 3)} s"
        )
        return result
    finally:
        if proc is not None:
            _stop_client(proc)
        gateway.stop()


def bare_round(count: int, round_no: int) -> dict[str, Any]:
    bare = start("bare")
    proc = None
    try:
        time.sleep(0.5)
        before = _quiet_rss(bare.pid)
        fds_before = open_fds(bare.pid)
        proc = subprocess.Popen(
            [PYTHON, str(CLIENT), "idle", "--url", f"{bare.base}/", "--count", str(count)],
            stdout=subprocess.PIPE,
            stdin=subprocess.PIPE,
            text=True,
        )
        sent = _read_event(proc, 120)
        held = _settled_rss(bare.pid, fds_before + count)
        assert proc.stdin is not None
        proc.stdin.write("go\n")
        proc.stdin.flush()
        done = _read_event(proc, 60)
        result = {
            "round": round_no,
            "connections": count,
            "rss_before_mb": before,
            "rss_held_mb": held["rss_mb"],
            "rss_samples_mb": held["samples"],
            "extra_mb": held["rss_mb"] - before,
            "fds_held": held["fds"],
            "ok": done["ok"],
            "bad": done["bad"],
            "open_seconds": sent["seconds"],
        }
        log(
            f"  round {round_no + 1}: bare RSS {before:.1f} -> {held['rss_mb']:.1f} MB "
            f"(+{result['extra_mb']:.1f}) with {done['ok']} idle connections"
        )
        return result
    finally:
        if proc is not None:
            with contextlib.suppress(OSError):
                _stop_client(proc)
        bare.stop()


def run(rounds: int, count: int) -> dict[str, Any]:
    out: dict[str, Any] = {"gateway": [], "bare": [], "count": count}
    for round_no in range(rounds):
        out["bare"].append(bare_round(count, round_no))
        out["gateway"].append(gateway_round(count, round_no))
    return out
