"""One node runs each webhook pipe's deliveries, and each bridge: a lock per thing,
renewed, fenced, and the things shared out evenly among the live nodes.

Every node of a cluster sees every webhook pipe in the catalogue, but a pipe's
receiver must get each message from one worker, not one per node. So a node runs the
worker of a webhook pipe only while it holds that pipe's lock, a key in the owners'
slot (``{<ns>:own}:hook:<pipe>``) holding the node's id and a **fencing token**:

* Each node with a webhook listener (the gateway's delivery registry) renews, every
  ``renew`` seconds, the locks it holds and takes free ones up to its share (below),
  in one function call (the library's ``own``); a lock lives ``ttl`` seconds unless
  renewed. The listener hears of a pipe when the node takes it (start its worker)
  and when it loses it (stop it). A node that made a webhook pipe takes it at once
  unless that would put it over its share by more than one. A node that stops frees
  its locks, so the others take its pipes in at most ``renew`` seconds; a node killed
  holds them until they run out (``ttl``).
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

**Balance.** The same call registers the node among the live ones (a sorted set
``{<ns>:own}:live``, each node scored by when its registration runs out, ``ttl``
after its last round, in the master's clock as the locks' expiry is; those past it
are trimmed by every call) and answers how many are live. A node's share is
ceil(things / live nodes), things being the webhook pipes and bridges it knows (every
node sees the same catalogue and configuration). Under its share, a node takes free
locks up to it; over it by more than one, or by one while some live node is under it
(the call also answers the fewest any live node holds), it hands the excess over (the
others take only up to their share: nothing goes to and fro): webhook pipes first
(their listener stops the workers, then the locks go, as on a clean stop), bridges
only when the pipes do not suffice (the bridge registry is told to stop the bridge;
its lock goes once the registry came back for the next change, at most ``ttl``
later), and the nodes under their share take them in their next round. A lock still
free at a node's next round (the nodes' views differ, or one is stalled) is taken by
it whatever its share, and kept: it hands others over instead. A node never takes a
lock another holds: fencing guards a hand-over as it guards a failure, and delivery
stays at least once, in order per pipe. Only nodes with a webhook listener count
among the live; one without (a tool's engine) claims bridges against the others'
count. A node that closes leaves the live set at once.
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
        # Bridges handed over for the balance: name -> when; their locks go once their
        # registry stopped them (or after ``ttl`` seconds).
        self.leaving: dict[str, float] = {}
        self.live = 0  # live nodes, as the last call saw them
        self.share = 0  # this node's share of the things, as the last call saw it
        self.least = 0  # the fewest things a live node holds, as the last call saw it
        self.counted = False  # whether this node registered among the live nodes
        self._told: dict[str, Any] = {}  # pipe -> its options when the listener heard
        self._free: set[str] = set()  # locks the last round found free and left
        # Locks taken overdue (over the share): never handed over (the node hands
        # others over instead), so that a view that differs for good (a node whose
        # configuration lacks a bridge) does not move them to and fro.
        self._adopted: set[str] = set()
        self._renewed = 0.0  # monotonic time of the last round the cluster answered
        self._poke = asyncio.Event()
        self._round = asyncio.Lock()

    def _lock(self, name: str) -> str:
        return f"{self.engine.keys.own}:{name}"

    @property
    def _fence(self) -> str:
        return f"{self.engine.keys.own}:fence"

    @property
    def _live(self) -> list[str]:
        """The live nodes, and how many things each holds."""
        return [f"{self.engine.keys.own}:live", f"{self.engine.keys.own}:counts"]

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
                    self.leaving.clear()
                    for solo in self.solos.values():
                        solo.set(False)
            except Exception:  # a bug of ours: logged, and the rounds go on
                log.exception("a round of the owners' locks failed")

    def poke(self) -> None:
        """Look again now (a listener came, or a webhook pipe was made elsewhere)."""
        self._poke.set()

    async def round(self) -> None:
        async with self._round:
            hooks = self._hooks()
            if not hooks and not self.solos:
                return  # (a node whose listener went frees its locks as it closes)
            names = [f"hook:{key}" for key in hooks] + list(self.solos)
            overdue = self._free
            tokens = await self._own(names, overdue=overdue)
            self._adopted = {name for name in self._adopted if tokens.get(name)}
            self._adopted.update(name for name in overdue if tokens.get(name))
            self._renewed = time.monotonic()
            # Held, and not asked about (the listener went, or the pipe): freed below.
            unasked = [f"hook:{key}" for key in self.held if f"hook:{key}" not in tokens]
            self._lose([key for key in self.held if not tokens.get(f"hook:{key}")])
            for key in hooks:
                if token := tokens[f"hook:{key}"]:
                    self.held[key] = token
                    await self._tell(key)
            for name, solo in self.solos.items():
                if name not in self.leaving:
                    solo.set(bool(tokens.get(name)))
            # A node whose listener went (it stops) leaves the live nodes at once: the
            # others' shares grow now, not once its registration runs out.
            leaves = self.counted and self.engine._hook_listener is None
            await self._disown(unasked + self._balance(tokens), leaves=leaves)

    def _balance(self, tokens: dict[str, int]) -> list[str]:
        """What this node hands over now: over its share by more than one (or by one
        while a live node is under its share), its excess (webhook pipes first: their
        workers stop here at once; bridges are told to stop and go in a later round,
        once stopped); and the bridges that stopped since."""
        now = time.monotonic()
        gone: list[str] = []
        for name, since in list(self.leaving.items()):
            solo = self.solos.get(name)
            if solo is None or not tokens.get(name):
                del self.leaving[name]  # forgotten, or its lock lost: nothing to free
            elif solo.stopped or now - since > self.ttl:
                if not solo.stopped:
                    log.warning("bridge %s did not stop in time; handed over anyway", name)
                del self.leaving[name]
                gone.append(name)
        bridges = sorted(n for n, solo in self.solos.items() if solo.held)
        excess = len(self.held) + len(bridges) - self.share
        # One over is let be unless a node is under its share (it takes the one handed
        # over, and no more: three nodes, three bridges end 1, 1, 1, not 2, 1, 0), so a
        # hand-over always narrows the gap between the most and the fewest held, and
        # nothing goes to and fro.
        if excess <= 0 or (excess == 1 and self.least >= self.share):
            return gone
        adopted = self._adopted
        hooks = [key for key in sorted(self.held) if f"hook:{key}" not in adopted][::-1]
        hooks = hooks[:excess]
        movable = [name for name in bridges if name not in adopted][::-1]
        movable = movable[: excess - len(hooks)]
        if hooks or movable:
            log.info(
                "%d over this node's share of %d (%d live nodes): %d webhook pipes and "
                "%d bridges handed over",
                excess,
                self.share,
                self.live,
                len(hooks),
                len(movable),
            )
        self._lose(hooks)  # the workers stop before the locks go
        for name in movable:
            self.leaving[name] = now
            self.solos[name].set(False)
        return gone + [f"hook:{key}" for key in hooks]

    async def claim(self, pipe: str) -> None:
        """Take a webhook pipe this node made at once, when its lock is free and this
        node is not over its share by more than one with it."""
        async with self._round:
            if self.engine._hook_listener is None:
                return
            token = (await self._own([f"hook:{pipe}"], slack=1))[f"hook:{pipe}"]
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
        """Free every lock this node holds, and leave the live nodes (a node that
        stops)."""
        held = [f"hook:{key}" for key in self.held] + list(self.solos)
        self.held = {}
        self._told.clear()
        self.leaving.clear()
        for solo in list(self.solos.values()):
            solo.set(False)
        self.solos.clear()
        await self._disown(held, leaves=True)

    async def _disown(self, names: list[str], *, leaves: bool = False) -> None:
        if leaves:
            self.counted = False
        for start in range(0, max(len(names), 1 if leaves else 0), CHUNK):
            keys = [*self._live, *map(self._lock, names[start : start + CHUNK])]
            await self.engine.link.call(
                self.engine.keys.own,
                "FCALL",
                FUNCTIONS + "disown",
                len(keys),
                *keys,
                self.node,
                "1" if leaves else "0",
                write=True,
            )

    # ------------------------------------------------------------ helpers
    def _hooks(self) -> list[str]:
        """The webhook pipes this node may run (none without a listener)."""
        if self.engine._hook_listener is None:
            return []
        return sorted(self.engine.cache.hooks)

    async def _own(
        self, names: list[str], slack: int = 0, overdue: set[str] | None = None
    ) -> dict[str, int]:
        """Renew the locks of ``names`` this node holds and take free ones while it
        holds fewer than its share (plus ``slack``), and those ``overdue`` (a round's:
        found free by the last one) whatever the share: this node's token of each, 0
        where another node holds it or this node took no more. A round's call keeps
        the locks it found free and left for the next round's ``overdue``."""
        if overdue is not None:  # (they go first: the function knows them by place)
            names = sorted(names, key=lambda name: name not in overdue)
            self._free = set()
        things = len(self._hooks()) + len(self.solos)
        holding = {f"hook:{key}" for key in self.held}
        holding.update(name for name, solo in self.solos.items() if solo.held)
        holding.update(self.leaving)
        counted = "1" if self.engine._hook_listener is not None else "0"
        tokens: dict[str, int] = {}
        ttl_ms = int(self.ttl * 1000)
        for start in range(0, len(names), CHUNK):
            chunk = names[start : start + CHUNK]
            # What this node holds besides this chunk: taken in the chunks before, and
            # believed held in those after.
            mine = sum(1 for token in tokens.values() if token)
            mine += len(holding.difference(chunk, tokens))
            late = sum(1 for name in chunk if overdue and name in overdue)
            keys = [self._fence, *self._live, *map(self._lock, chunk)]
            live, share, least, *reply = await self.engine.link.call(
                self.engine.keys.own,
                "FCALL",
                FUNCTIONS + "own",
                len(keys),
                *keys,
                self.node,
                ttl_ms,
                things,
                mine,
                slack,
                counted,
                late,
                write=True,
            )
            self.live, self.share, self.least = int(live), int(share), int(least)
            self.counted = self.counted or counted == "1"  # (it leaves through _disown)
            for name, token in zip(chunk, map(int, reply), strict=True):
                if token < 0 and overdue is not None:
                    self._free.add(name)
                tokens[name] = max(token, 0)
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
        # Changes made, those :meth:`changed` answered, and those its caller acted on
        # (it came back for the next): a bridge handed over for the balance keeps its
        # lock until its registry has stopped it.
        self._made = self._heard = self._acted = 0

    def set(self, held: bool) -> None:
        if held != self.held:
            self.held = held
            self._made += 1
            self._changed.set()

    @property
    def stopped(self) -> bool:
        """Not held, and the registry acted on every change it was told of."""
        return not self.held and self._acted == self._made

    async def take(self) -> bool:
        owners = self.owners
        owners.solos[self.name] = self
        async with owners._round:
            self.set(bool((await owners._own([self.name], slack=1))[self.name]))
        self._changed.clear()
        self._heard = self._made  # the caller hears it from the answer
        return self.held

    async def changed(self) -> bool:
        self._acted = self._heard
        await self._changed.wait()
        self._changed.clear()
        self._heard = self._made
        return self.held

    async def release(self) -> None:
        owners = self.owners
        if owners.solos.get(self.name) is self:
            del owners.solos[self.name]
        leaving = owners.leaving.pop(self.name, None) is not None
        if self.held or leaving:
            self.set(False)
            await owners._disown([self.name])
