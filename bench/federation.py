"""Federation link throughput and latency, against publishing to the remote directly.

Two gateways on 127.0.0.1: B, and A with a push link of its ``news`` feed to B's
(docs/FEDERATION.md). Each round, in alternating order:

- **direct**: ``--count`` messages published to B's feed in ``--batch``-message JSON
  documents, one request at a time, into a pipe on B; the rate is the count over the
  time until the last publish was answered.
- **link**: the same published to A's feed while B is stopped, so they wait in the
  link's pipe; then B is started again, and the rate is the messages the link
  delivers over the time from its first acknowledgement by B to its last (the link's
  own pace, not A's: publishing to A waits for A's disk, as the link's pipe is durable).
- **warm**: the same as **link**, but B is not restarted (its caches warm, as in the
  direct runs): A's second link, of its ``warm`` feed, gets 404 while B has no such
  feed, the messages wait in its pipe, then B's feed is made.
- **end to end**: the same published to A's feed with B up; the rate is the count over
  the time from the first publish until A's link has had the last one acknowledged.

With ``--pull``, also **pull**: B's pull link of A's ``pulled`` feed, timed as the push
link is (the messages wait in its pipe on A while B is stopped), with ``--pull-count``
messages (a tenth of ``--count`` by default). ``--only-pull`` runs only **direct** and
**pull** (no push link runs, no latency), and ``--root DIR`` runs both gateways from
another checkout (another commit's worktree), so the pull links of two commits can be
timed in turns, on this checkout's benchmark.

Each run also reports the CPU time each gateway spent per message (from /proc), a
figure steadier than rates on a shared machine. A's acknowledged count is read from
its metrics page, seldom while much is left (each read costs A time the link would
use) and every few milliseconds near the end.

Then ``--latency`` single messages, one at a time, from a publish (to A, or to B
directly) until a GET waiting on the asynclet of a pipe on B returns it: p50 and p99.

    .venv/bin/python -m bench.federation [--rounds 3] [--count 20000] [--batch 100] \
        [--ids] [--pull] [--only-pull] [--pull-count N] [--root DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import secrets
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import uvloop

from bench.common import (
    RESULTS,
    ROOT,
    Server,
    cpu_seconds,
    free_port,
    log,
    machine,
    payload,
    percentile,
    stop_all,
)

HEADERS = {"Content-Type": "application/restms+json", "Accept": "application/restms+json"}


def configs(directory: Path, a_port: int, b_port: int, link_batch: int = 500) -> tuple[Path, Path]:
    """A pushes its ``news`` to B's; B pulls A's ``pulled`` into its own."""
    feeds = (
        '[[feeds]]\nname = "news"\ntype = "topic"\n\n[[feeds]]\nname = "pulled"\ntype = "topic"\n'
    )
    # Room for every message of a run in each pipe (1 KiB messages): a pipe past its
    # default 64 MiB would skip the rest, and the run would wait for them in vain.
    common = (
        'metrics_access = "loopback"\nmax_pipe_messages = 1000000\nmax_pipe_bytes = 2147483648\n'
    )
    tuning = f"batch = {link_batch}\nretry_min = 0.05\nretry_max = 0.2\n"
    b = directory / "b.toml"
    remote = f"http://127.0.0.1:{a_port}/restms/feed/pulled"
    pull = (
        '\n[[bridges]]\nkind = "federation"\nname = "from-a"\ndirection = "in"\n'
        f'feed = "pulled"\naddress = "#"\nremote = "{remote}"\n{tuning}'
    )
    b.write_text(f'gateway_id = "bench-b"\n{common}\n{feeds}{pull}', encoding="utf-8")
    a = directory / "a.toml"
    remote = f"http://127.0.0.1:{b_port}/restms/feed/news"
    push = "".join(
        f'\n[[bridges]]\nkind = "federation"\nname = "{name}"\ndirection = "out"\n'
        f'feed = "{feed}"\naddress = "#"\nremote = "{remote.replace("/news", "/" + feed)}"\n'
        f"{tuning}max_messages = 1000000\n"
        for name, feed in (("to-b", "news"), ("to-b-warm", "warm"))
    )
    a_feeds = feeds + '[[feeds]]\nname = "warm"\ntype = "topic"\n'
    a.write_text(f'gateway_id = "bench-a"\n{common}\n{a_feeds}{push}', encoding="utf-8")
    return a, b


def documents(count: int, batch: int, tag: str, ids: bool = False) -> list[bytes]:
    """The publish documents of ``count`` 1 KiB messages; with ``ids``, each has a
    ``message_id`` (as every message a link sends has)."""
    text = payload(tag=tag)
    out = []
    for start in range(0, count, batch):
        size = min(batch, count - start)
        messages = [
            {"address": "news.bench", "content": [{"value": text}]}
            | ({"message_id": f"{tag}-{start + i}"} if ids else {})
            for i in range(size)
        ]
        out.append(orjson.dumps({"restms": {"message": messages}}))
    return out


async def reader(http: aiohttp.ClientSession, base: str, feed: str = "news") -> str:
    async with http.post(f"{base}/restms/domain/default", data=b'{"restms":{"pipe":[{}]}}',
                         headers=HEADERS) as r:  # fmt: skip
        assert r.status == 201, await r.text()
        pipe = r.headers["Location"]
    join = {"restms": {"join": [{"feed": f"{base}/restms/feed/{feed}", "address": "#"}]}}
    async with http.post(pipe, data=orjson.dumps(join), headers=HEADERS) as r:
        assert r.status == 201, await r.text()
    return str(pipe)


async def acked(
    http: aiohttp.ClientSession, base: str, bridge: str = "to-b", counter: str = "acked"
) -> float:
    """Messages the gateway at ``base``'s link ``bridge`` has acknowledged (or another
    of its counters)."""
    async with http.get(f"{base}/metrics") as r:
        for line in (await r.text()).splitlines():
            if line.startswith(f'restms_bridge_{counter}_total{{bridge="{bridge}"}}'):
                return float(line.rpartition(" ")[2])
    return 0.0


async def publish_all(http: aiohttp.ClientSession, feed: str, docs: list[bytes]) -> None:
    for body in docs:
        async with http.post(feed, data=body, headers=HEADERS) as r:
            if r.status != 200:
                raise RuntimeError(f"publish answered {r.status}: {await r.text()}")
            await r.read()


async def throughput(
    http: aiohttp.ClientSession,
    a: Server,
    b: Remote,
    side: str,
    count: int,
    batch: int,
    ids: bool,
    pull_count: int = 0,
) -> tuple[float, dict[str, float]]:
    """The rate of one run, and the CPU time each gateway spent per message meanwhile
    (microseconds: steadier than rates on a shared machine)."""
    pipe = await reader(http, b.url)
    docs = documents(count, batch, secrets.token_hex(4), ids)
    try:
        if side == "direct":
            usage = Usage(b=b.pid)
            started = time.perf_counter()
            await publish_all(http, f"{b.url}/restms/feed/news", docs)
            return count / (time.perf_counter() - started), usage.per(count)
        if side == "warm":
            return await warm(http, a, b, docs, count)
        if side == "pull":
            part = documents(pull_count, batch, secrets.token_hex(4), ids)
            return await pulled(http, a, b, part, pull_count)
        before = await acked(http, a.base)
        if side == "end_to_end":
            usage = Usage(a=a.pid, b=b.pid)
            started = time.perf_counter()
            await publish_all(http, f"{a.base}/restms/feed/news", docs)
            await until_acked(http, a.base, before + count)
            return count / (time.perf_counter() - started), usage.per(count)
        await asyncio.to_thread(b.stop)
        await publish_all(http, f"{a.base}/restms/feed/news", docs)
        await asyncio.to_thread(b.start)
        first = await moved(http, a.base, before)
        usage = Usage(a=a.pid, b=b.pid)  # from here: the link's work alone
        started = time.perf_counter()
        await until_acked(http, a.base, before + count)
        moving = before + count - first
        return moving / (time.perf_counter() - started), usage.per(int(moving))
    finally:
        async with http.delete(pipe) as r:
            await r.read()


async def warm(
    http: aiohttp.ClientSession, a: Server, b: Remote, docs: list[bytes], count: int
) -> tuple[float, dict[str, float]]:
    """The push link's own pace to a B that is not restarted (warm, as in the direct
    runs): A's link ``to-b-warm`` waits while B has no ``warm`` feed (404: it retries),
    the messages gather in its pipe, then B's feed is made and the link drains."""
    feed = f"{b.url}/restms/feed/warm"
    before = await acked(http, a.base, "to-b-warm")
    await publish_all(http, f"{a.base}/restms/feed/warm", docs)
    document = b'{"restms":{"feed":[{"name":"warm","type":"topic"}]}}'
    async with http.post(f"{b.url}/restms/domain/default", data=document, headers=HEADERS) as r:
        assert r.status == 201, await r.text()
    pipe = await reader(http, b.url, "warm")
    try:
        first = await moved(http, a.base, before, "to-b-warm")
        usage = Usage(a=a.pid, b=b.pid)
        started = time.perf_counter()
        await until_acked(http, a.base, before + count, "to-b-warm")
        moving = before + count - first
        return moving / (time.perf_counter() - started), usage.per(int(moving))
    finally:
        for url in (pipe, feed):  # the feed goes: the next run's messages wait again
            async with http.delete(url) as r:
                await r.read()


async def pulled(
    http: aiohttp.ClientSession, a: Server, b: Remote, docs: list[bytes], count: int
) -> tuple[float, dict[str, float]]:
    """B's pull link's own pace: the messages wait in its pipe on A while B is
    stopped; the rate is from B's first publish of what it read (its first batch) to
    its last acknowledgement on A (counted by B's link, which starts from 0 with B).
    Not from its first acknowledgement: a link may publish several batches ahead of
    its acknowledgements, and their work would not be counted."""
    await asyncio.to_thread(b.stop)
    await publish_all(http, f"{a.base}/restms/feed/pulled", docs)
    await asyncio.to_thread(b.start)
    first = await moved(http, b.url, 0.0, "from-a", "published")
    usage = Usage(a=a.pid, b=b.pid)
    started = time.perf_counter()
    await until_acked(http, b.url, count, "from-a")
    return (count - first) / (time.perf_counter() - started), usage.per(int(count - first))


async def pull_ready(http: aiohttp.ClientSession, a: Server, b: Remote) -> None:
    """Wait until B's pull link reads its pipe on A (made when the link first starts):
    a message published to A's feed before then would not reach it."""
    body = documents(1, 1, "ready")[0]
    for _ in range(150):  # 30 s
        before = await acked(http, b.url, "from-a")
        await publish_all(http, f"{a.base}/restms/feed/pulled", [body])
        await asyncio.sleep(0.2)
        if await acked(http, b.url, "from-a") > before:
            return
    raise RuntimeError("B's pull link took nothing from A in 30 s")


class Usage:
    """CPU time of named processes from now on."""

    def __init__(self, **pids: int) -> None:
        self.pids = pids
        self.start = {name: cpu_seconds(pid) for name, pid in pids.items()}

    def per(self, count: int) -> dict[str, float]:
        """Microseconds of CPU time per message, each process."""
        return {
            name: (cpu_seconds(pid) - self.start[name]) / count * 1e6
            for name, pid in self.pids.items()
        }


async def moved(
    http: aiohttp.ClientSession,
    base: str,
    before: float,
    bridge: str = "to-b",
    counter: str = "acked",
) -> float:
    """The link's acknowledged count (or ``counter``) once it is past ``before`` (B is
    back)."""
    for _ in range(1500):  # 30 s
        now = await acked(http, base, bridge, counter)
        if now > before:
            return now
        await asyncio.sleep(0.02)  # (each look costs A, as in until_acked)
    raise RuntimeError("the link sent nothing in 30 s after B came back")


async def until_acked(
    http: aiohttp.ClientSession, base: str, total: float, bridge: str = "to-b"
) -> None:
    """Poll A's acknowledged count until it reaches ``total``: seldom while much is left
    (each look costs A a metrics page, ~0.6 ms of its time, taken from the link), more
    often near the end, so the time of the last acknowledgement is within ~2 ms."""
    started = time.perf_counter()
    deadline = started + 300
    first = now = await acked(http, base, bridge)
    while now < total:
        if time.perf_counter() > deadline:
            raise RuntimeError("the link did not deliver everything in 300 s")
        elapsed = time.perf_counter() - started
        rate = (now - first) / elapsed if now > first else 0.0
        left = (total - now) / rate if rate else 0.04  # (no pace yet: a guess)
        await asyncio.sleep(min(0.05, max(0.002, left / 2)))
        now = await acked(http, base, bridge)


class Remote:
    """Gateway B, stopped and started again on its port and data directory."""

    def __init__(self, port: int, config: Path, data: Path, root: Path) -> None:
        self.port, self.config, self.data, self.root = port, config, data, root
        self.server: Server | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        assert self.server is not None
        return self.server.pid

    def start(self) -> None:
        extra = ("--config", str(self.config))
        self.server = Server(
            "gateway",
            data_dir=str(self.data),
            name="federation-b",
            port=self.port,
            extra=extra,
            root=self.root,
        )
        self.server.wait_ready()

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None


async def latency(
    http: aiohttp.ClientSession, a: str, b: str, side: str, count: int
) -> list[float]:
    pipe = await reader(http, b)
    target = f"{b if side == 'direct' else a}/restms/feed/news"
    samples = []
    try:
        async with http.get(pipe, headers=HEADERS) as r:
            listed = orjson.loads(await r.read())["restms"]["pipe"][0]["message"]
        asynclet = next(m["href"] for m in listed if m.get("async") == "1")
        position = int(asynclet.rpartition(".")[2])
        message = {"address": "news.lat", "content": [{"value": "x"}]}
        body = orjson.dumps({"restms": {"message": [message]}})
        for _ in range(count):
            url = f"{pipe}.{position}"
            waiting = asyncio.ensure_future(http.get(url, headers=HEADERS))
            await asyncio.sleep(0.002)  # the GET is waiting before the publish
            started = time.perf_counter()
            async with http.post(target, data=body, headers=HEADERS) as r:
                await r.read()
            async with await waiting as got:
                await got.read()
                assert got.status == 200, got.status
            samples.append((time.perf_counter() - started) * 1000)
            async with http.delete(url) as r:
                await r.read()
            position += 1
    finally:
        async with http.delete(pipe) as r:
            await r.read()
    return samples


SIDES = ("direct", "link", "warm", "end_to_end")


async def run(args: argparse.Namespace, a: Server, b: Remote) -> dict[str, Any]:
    sides = ("direct", "pull") if args.only_pull else (*SIDES, "pull") if args.pull else SIDES
    pull_count = args.pull_count or max(1, args.count // 10)
    rates: dict[str, list[float]] = {side: [] for side in sides}
    cpu: dict[str, list[dict[str, float]]] = {side: [] for side in sides}
    lat: dict[str, list[float]] = {"direct": [], "link": []}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as http:
        if not args.only_pull:
            await throughput(http, a, b, "end_to_end", 2000, args.batch, args.ids)  # warm-up
        if "pull" in sides:
            await pull_ready(http, a, b)
        for n in range(args.rounds):
            order = sides if n % 2 == 0 else sides[::-1]
            for side in order:
                rate, used = await throughput(
                    http, a, b, side, args.count, args.batch, args.ids, pull_count
                )
                rates[side].append(rate)
                cpu[side].append(used)
                shown = ", ".join(f"{name} {us:.1f}" for name, us in used.items())
                log(f"  round {n + 1}/{args.rounds} {side:10s} {rate:,.0f} msg/s ({shown} us CPU)")
            for side in (
                () if args.only_pull else ("direct", "link") if n % 2 == 0 else ("link", "direct")
            ):
                lat[side].extend(await latency(http, a.base, b.url, side, args.latency))
    return {
        "rates": rates,
        "ratio_median": {
            side: statistics.median(
                x / d for x, d in zip(rates[side], rates["direct"], strict=True)
            )
            for side in sides
            if side != "direct"
        },
        "cpu_us_per_message_median": {
            side: {name: statistics.median(run[name] for run in runs) for name in runs[0]}
            for side, runs in cpu.items()
        },
        "latency_ms": {
            side: {"p50": percentile(values, 50), "p99": percentile(values, 99)}
            for side, values in lat.items()
        },
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--count", type=int, default=20_000)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--latency", type=int, default=200)
    parser.add_argument(
        "--ids", action="store_true", help="every message published has a message_id"
    )
    parser.add_argument("--pull", action="store_true", help="also time B's pull link from A")
    parser.add_argument("--link-batch", type=int, default=500, help="the links' batch")
    parser.add_argument(
        "--only-pull", action="store_true", help="time only direct publishing and the pull link"
    )
    parser.add_argument(
        "--pull-count", type=int, default=0, help="messages a pull run (a tenth of --count)"
    )
    parser.add_argument(
        "--root", type=Path, default=ROOT, help="the checkout whose gateways run (this one)"
    )
    args = parser.parse_args()
    RESULTS.mkdir(parents=True, exist_ok=True)
    a_port, b_port = free_port(), free_port()
    directory = Path(RESULTS / f"federation-{secrets.token_hex(3)}")
    directory.mkdir()
    a_conf, b_conf = configs(directory, a_port, b_port, args.link_batch)
    a = Server(
        "gateway",
        name="federation-a",
        port=a_port,
        extra=("--config", str(a_conf)),
        root=args.root,
    )
    b = Remote(b_port, b_conf, directory / "b-data", args.root)
    b.start()
    a.wait_ready()
    try:
        out = uvloop.run(run(args, a, b))
    finally:
        stop_all()
    out["machine"] = machine()
    out["args"] = vars(args)
    print(json.dumps(out, indent=1, default=str))
    ratios, cpu = out["ratio_median"], out["cpu_us_per_message_median"]
    if args.only_pull:
        log(
            f"pull link against direct (medians of {args.rounds}): {ratios['pull']:.3f}, "
            f"{statistics.median(out['rates']['pull']):,.0f} msg/s; CPU us/msg: direct B "
            f"{cpu['direct']['b']:.1f}, pull A {cpu['pull']['a']:.1f} B {cpu['pull']['b']:.1f}"
        )
        return 0
    log(
        f"against direct (medians of {args.rounds}): link {ratios['link']:.2f} "
        f"(B warm: {ratios['warm']:.2f}), "
        f"end to end {ratios['end_to_end']:.2f}; latency p50 "
        f"link {out['latency_ms']['link']['p50']:.2f} ms, "
        f"direct {out['latency_ms']['direct']['p50']:.2f} ms; CPU us/msg: direct B "
        f"{cpu['direct']['b']:.1f}, link A {cpu['link']['a']:.1f} B {cpu['link']['b']:.1f}"
    )
    if args.pull:
        log(f"pull link against direct: {ratios['pull']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
