"""One gateway node's engine on a namespace that holds a large catalogue (part of
benchmark 17: ``bench.cluster --only pipes``): how long its start takes and the longest
its event loop went without turning meanwhile (with the gateway's collector settings,
which it sets before its engine starts); then, running as a started gateway does (what
its start built frozen), how long reading the whole catalogue again takes and the
longest stall then, as when a node fell further behind than the log of changes reaches;
then the same for the engine's stats (the census each scrape of /metrics takes) and
for every pipe's state (the admin API's list of pipes and its overview).

    .venv/bin/python bench/node_start.py --root DIR --url URL --namespace NS

Runs the engine of the project at ``--root`` (this tree, or the worktree of a base
commit), in a process of its own so that each side imports its own code. Prints one
JSON object: ``seconds``, ``longest_stall_ms``, ``reload_seconds``,
``reload_longest_stall_ms``, ``stats_seconds``, ``stats_longest_stall_ms``,
``states_seconds``, ``states_longest_stall_ms``, ``states`` (how many it gave) and
``pipes`` (how many the node knows).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import sys
import time
from typing import Any


class Stalls:
    """The longest the event loop went without turning, while it runs."""

    def __init__(self) -> None:
        self.longest = 0.0
        self.last = time.perf_counter()
        self.task = asyncio.create_task(self._turns())

    def _turned(self) -> None:
        now = time.perf_counter()
        self.longest = max(self.longest, now - self.last)
        self.last = now

    async def _turns(self) -> None:
        while True:
            await asyncio.sleep(0)
            self._turned()

    async def stop(self) -> float:
        """The longest stall, ms, the one that ends now included."""
        self._turned()
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)
        return self.longest * 1000


async def measure(url: str, namespace: str) -> dict[str, Any]:
    from feeds.config import EngineConfig
    from feeds.redis import RedisEngine, syncing
    from gateway.server.run import GC_THRESHOLDS

    engine = RedisEngine.open(EngineConfig(), url, namespace=namespace)
    gc.set_threshold(*GC_THRESHOLDS)  # as the gateway sets them, before its engine starts
    stalls = Stalls()
    began = time.perf_counter()
    try:
        await engine.start()
        took = time.perf_counter() - began
        start_stall = await stalls.stop()
        # Then serving, as the gateway runs once started: what start-up built frozen.
        # The node has fallen behind further than the log of changes reaches (version 1
        # is long gone from it), so it reads it all again.
        gc.collect()
        gc.freeze()
        engine.cache.version = 1
        stalls = Stalls()
        began = time.perf_counter()
        await syncing.sync(engine)
        again = time.perf_counter() - began
        reload_stall = await stalls.stop()
        # The census, as each scrape of /metrics takes it.
        stalls = Stalls()
        began = time.perf_counter()
        await engine.stats()
        stats = time.perf_counter() - began
        stats_stall = await stalls.stop()
        # Every pipe's state, as the admin API's list of pipes and its overview read it.
        stalls = Stalls()
        began = time.perf_counter()
        states = await engine.pipe_states()
        return {
            "seconds": took,
            "longest_stall_ms": start_stall,
            "reload_seconds": again,
            "reload_longest_stall_ms": reload_stall,
            "stats_seconds": stats,
            "stats_longest_stall_ms": stats_stall,
            "states_seconds": time.perf_counter() - began,
            "states_longest_stall_ms": await stalls.stop(),
            "states": len(states),
            "pipes": len(engine.cache.pipes),
        }
    finally:
        await engine.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--root", required=True, help="the project whose engine starts")
    parser.add_argument("--url", required=True, help="a seed node of the cluster")
    parser.add_argument("--namespace", required=True)
    args = parser.parse_args()
    sys.path.insert(0, args.root)
    import uvloop

    print(json.dumps(uvloop.run(measure(args.url, args.namespace))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
