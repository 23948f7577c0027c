"""One node runs each webhook pipe's deliveries, and each bridge: a lock per thing,
renewed, fenced.

Every node of a cluster sees every webhook pipe in the catalogue, but a pipe's
receiver must get each message from one worker, not one per node. So a node runs the
worker of a webhook pipe only while it holds that pipe's lock, a key in the owners'
slot (``{<ns>:own}:hook:<pipe>``) holding the node's id and a **fencing token**:

* Each node with a webhook listener (the gateway's delivery registry) takes, every
  ``renew`` seconds, the locks of webhook pipes nobody holds and renews those it holds,
  in one function call (the library's ``own``); a lock lives ``ttl`` seconds unless
  renewed. The listener hears of a pipe when the node takes it (start its worker)
  and when it loses it (stop it). A node that made a webhook pipe tries to take it at
  once. A node that stops frees its locks, so another takes its pipes in at most
  ``renew`` seconds; a node killed holds them until they run out (``ttl``).
* A token is new each time a lock is taken and only grows (one counter). A worker's
  writes to its pipe's delivery state carry the node's token, and the state keeps the
  highest it saw: once a newer owner wrote, a write of the node that lost the lock (a
  paused process, a partition outlasting ``ttl``) is refused, and its worker stops.
  The message a stale worker was sending may still arrive: delivery is at least once,
  and the receiver knows a repeat by its ``X-RestMS-Message-Id``.
* A node that cannot renew for ``ttl`` seconds (the owners' slot unreachable) stops
  its workers: another node may hold the locks by then.

A bridge claims its lock (``bridge:<name>``) through :meth:`Owners.solo`: the same
rounds take and renew it, and its :class:`RedisSolo` tells the bridge registry when
this node takes or loses it.

The first node to look takes every free lock; a node does not hand them over to
balance the load (docs/CLUSTER.md).
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import socket
import time
from typing import TYPE_CHECKING, Any

from restms.errors import NotFound, ServiceUnavailable

from .link import FUNCTIONS
from .values import webhook

if TYPE_CHECKING:
    from .service import RedisEngine

log = logging.getLogger(__name__)

TTL = 5.0  # seconds a lock lives unless renewed
RENEW = 1.0  # seconds between a node's rounds
CHUNK = 500  # locks per function call


class Owners:
    """The webhook pipes this node runs, and their fencing tokens."""

    def __init__(self, engine: RedisEngine, ttl: float = TTL, renew: float = RENEW) -> None:
        self.engine = engine
        self.ttl = ttl
        self.renew = renew
        # Unique per engine: a restarted node is a new owner, its old locks not its own.
        self.node = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"
        self.held: dict[str, int] = {}  # pipe -> this node's token
        self.solos: dict[str, RedisSolo] = {}  # name -> claim (a bridge's)
        self._told: dict[str, Any] = {}  # pipe -> its options when the listener heard
        self._renewed = 0.0  # monotonic time of the last round the cluster answered
        self._poke = asyncio.Event()
        self._round = asyncio.Lock()

    def _lock(self, name: str) -> str:
        return f"{self.engine.keys.own}:{name}"

    @property
    def _fence(self) -> str:
        return f"{self.engine.keys.own}:fence"

    def token(self, pipe: str) -> int:
        """The token a write of ``pipe``'s delivery state carries: 0 on an engine that
        runs no workers (no listener: its writes are not a worker's); NotFound, which
        stops the worker, when this node no longer holds the pipe."""
        if self.engine._hook_listener is None:
            return 0
        token = self.held.get(pipe)
        if token is None:
            raise NotFound("another gateway node runs that pipe's webhook deliveries")
        return token

    # ------------------------------------------------------------ rounds
    async def run(self) -> None:
        """Take and renew locks every ``renew`` seconds (sooner when poked)."""
        while not self.engine._closing:
            try:
                async with asyncio.timeout(self.renew):
                    await self._poke.wait()
            except TimeoutError:
                pass
            self._poke.clear()
            try:
                await self.round()
            except ServiceUnavailable as exc:
                log.warning("renewing the owners' locks failed: %s", exc.reason)
                if time.monotonic() - self._renewed > self.ttl:
                    if self.held or any(solo.held for solo in self.solos.values()):
                        log.warning("the locks may have run out: what this node runs stops")
                    self._lose(list(self.held))
                    for solo in self.solos.values():
                        solo.set(False)
            except Exception:  # a bug of ours: logged, and the rounds go on
                log.exception("a round of the owners' locks failed")

    def poke(self) -> None:
        """Look again now (a listener came, or a webhook pipe was made elsewhere)."""
        self._poke.set()

    async def round(self) -> None:
        async with self._round:
            hooks: list[str] = []
            if self.engine._hook_listener is not None:
                pipes = self.engine.cache.pipes
                hooks = sorted(key for key, pipe in pipes.items() if pipe.type == "webhook")
            if not hooks and not self.solos:
                return
            tokens = await self._own([f"hook:{key}" for key in hooks] + list(self.solos))
            self._renewed = time.monotonic()
            self._lose([key for key in self.held if not tokens.get(f"hook:{key}")])
            for key in hooks:
                if token := tokens[f"hook:{key}"]:
                    self.held[key] = token
                    await self._tell(key)
            for name, solo in self.solos.items():
                solo.set(bool(tokens.get(name)))

    async def claim(self, pipe: str) -> None:
        """Take a webhook pipe this node made at once, when its lock is free."""
        async with self._round:
            if self.engine._hook_listener is None:
                return
            token = (await self._own([f"hook:{pipe}"]))[f"hook:{pipe}"]
            if token:
                self.held[pipe] = token
                await self._tell(pipe)

    def solo(self, name: str) -> RedisSolo:
        return RedisSolo(self, name)

    async def changed(self, pipe: str) -> None:
        """A PUT changed a webhook pipe's options: its worker here starts again (a
        node that holds it elsewhere sees the change in its next round)."""
        if pipe in self.held:
            await self._tell(pipe)

    def dropped(self, pipe: str) -> None:
        """A webhook pipe was deleted through this node: its worker here stops."""
        self._lose([pipe] if pipe in self.held else [])

    async def release(self) -> None:
        """Free every lock this node holds (a node that stops)."""
        held = [f"hook:{key}" for key in self.held] + list(self.solos)
        self.held = {}
        self._told.clear()
        for solo in list(self.solos.values()):
            solo.set(False)
        self.solos.clear()
        await self._disown(held)

    async def _disown(self, names: list[str]) -> None:
        for start in range(0, len(names), CHUNK):
            keys = [self._lock(name) for name in names[start : start + CHUNK]]
            await self.engine.link.call(
                self.engine.keys.own, "FCALL", FUNCTIONS + "disown", len(keys), *keys, self.node
            )

    # ------------------------------------------------------------ helpers
    async def _own(self, names: list[str]) -> dict[str, int]:
        """Take or renew the locks of ``names``: this node's token of each, 0 where
        another node holds it."""
        tokens: dict[str, int] = {}
        ttl_ms = int(self.ttl * 1000)
        for start in range(0, len(names), CHUNK):
            chunk = names[start : start + CHUNK]
            keys = [self._fence, *map(self._lock, chunk)]
            reply = await self.engine.link.call(
                self.engine.keys.own,
                "FCALL",
                FUNCTIONS + "own",
                len(keys),
                *keys,
                self.node,
                ttl_ms,
                write=True,
            )
            tokens.update(zip(chunk, map(int, reply), strict=True))
        return tokens

    async def _tell(self, pipe: str) -> None:
        """The listener hears of a pipe this node holds: taken, or its options changed."""
        from .webhooks import hook_of

        listener = self.engine._hook_listener
        found = self.engine.cache.pipes.get(pipe)
        if listener is None or found is None:
            return
        if pipe in self._told and self._told[pipe] == found.options:
            return
        hook = await hook_of(self.engine, found)
        if hook is not None and pipe in self.held:
            self._told[pipe] = found.options
            listener(pipe, webhook(found, hook))

    def _lose(self, pipes: list[str]) -> None:
        listener = self.engine._hook_listener
        for key in pipes:
            self.held.pop(key, None)
            if self._told.pop(key, None) is not None and listener is not None:
                listener(key, None)


class RedisSolo:
    """A bridge's claim (:class:`feeds.service.Solo`) among the engine's nodes."""

    def __init__(self, owners: Owners, name: str) -> None:
        self.owners = owners
        self.name = name
        self.held = False
        self._changed = asyncio.Event()

    def set(self, held: bool) -> None:
        if held != self.held:
            self.held = held
            self._changed.set()

    async def take(self) -> bool:
        owners = self.owners
        owners.solos[self.name] = self
        async with owners._round:
            self.set(bool((await owners._own([self.name]))[self.name]))
        self._changed.clear()
        return self.held

    async def changed(self) -> bool:
        await self._changed.wait()
        self._changed.clear()
        return self.held

    async def release(self) -> None:
        owners = self.owners
        if owners.solos.get(self.name) is self:
            del owners.solos[self.name]
        if self.held:
            self.set(False)
            await owners._disown([self.name])
