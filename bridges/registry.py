"""The gateway's bridges: those declared in the configuration file and those made at
run time through the admin resource, which are kept in ``<data>/bridges.json`` (mode
0600: broker passwords) so they come back after a restart.

Bridges start in the order they were declared (configured ones first) and stop in
reverse order. A bridge that cannot reach its broker or feed does not hold up the
gateway: it keeps retrying and says why in its status.

A bridge runs on one node at a time of the nodes that share an engine (a cluster,
docs/CLUSTER.md): each bridge claims its name from the engine service
(:meth:`feeds.service.EngineService.solo`) and runs only while this node holds it.
The others keep it stopped, standing by, and start it when its node stops or dies;
its pipe is in the engine, so the node that takes over sends what was left in it. With
the embedded engine the one process always holds it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import zmq.asyncio

from feeds.service import Solo
from restms.errors import BadRequest, Conflict, Forbidden, NotFound, ServiceUnavailable

from .amqp import AmqpBridge
from .base import Host
from .common import owner_of
from .config import AmqpBridgeConfig, BridgeConfig, ZmqBridgeConfig, parse
from .federation.config import FederationConfig
from .federation.link import FederationLink
from .zeromq import ZapGate, ZmqBridge
from .zmq_rpc import DealerBridge, RouterBridge

log = logging.getLogger(__name__)

AnyBridge = AmqpBridge | ZmqBridge | FederationLink


class Registry:
    """Every bridge of one gateway, by name."""

    def __init__(
        self,
        host: Host,
        configured: Sequence[BridgeConfig],
        *,
        state_file: Path | None,
        max_body: int,
    ) -> None:
        self._host = host
        self._configured = tuple(configured)
        self._state_file = state_file
        self._max_body = max_body
        self._bridges: dict[str, AnyBridge] = {}
        self._solos: dict[str, Solo] = {}  # name -> this node's claim on running it
        self._following: dict[str, asyncio.Task[None]] = {}  # name -> its claim's watch
        self._zmq: zmq.asyncio.Context | None = None  # one for every ZeroMQ bridge (inproc)
        self._zap: ZapGate | None = None
        self._lock = asyncio.Lock()
        self.gateway_id = ""  # federation links name this gateway so (given at start)
        names = [c.name for c in self._configured]
        if len(set(names)) != len(names):
            raise ValueError("two [[bridges]] have the same name")

    def __iter__(self) -> Any:
        return iter(list(self._bridges.values()))

    def get(self, name: str) -> AnyBridge:
        bridge = self._bridges.get(name)
        if bridge is None:
            raise NotFound(f"no bridge named {name!r}")
        return bridge

    # ------------------------------------------------------------ lifecycle
    async def start(self, gateway_id: str) -> None:
        """Start the configured bridges, then the ones kept from earlier runs;
        ``gateway_id`` is the name federation links give this gateway (docs/FEDERATION.md)."""
        self.gateway_id = gateway_id
        kept = await asyncio.to_thread(self._load) if self._state_file else []
        for config in self._configured:
            await self._start(config, configured=True)
        for config in kept:
            if config.name in self._bridges:
                log.warning(
                    "bridge %s is configured now; its run-time copy is dropped", config.name
                )
                continue
            await self._start(config, configured=False)

    async def stop(self) -> None:
        for bridge in reversed(list(self._bridges.values())):
            await self._forget(bridge)
        self._bridges.clear()
        if self._zap is not None:
            self._zap.stop()
        if self._zmq is not None:
            # every socket is closed; term() waits for their linger, so not on the loop
            await asyncio.to_thread(self._zmq.term)
            self._zmq = self._zap = None

    def _make(self, config: BridgeConfig, *, configured: bool) -> AnyBridge:
        if isinstance(config, AmqpBridgeConfig):
            return AmqpBridge(config, self._host, configured=configured, max_body=self._max_body)
        if isinstance(config, FederationConfig):
            return FederationLink(
                config, self._host, configured=configured, gateway_id=self.gateway_id
            )
        if self._zmq is None:
            self._zmq = zmq.asyncio.Context()
            self._zap = ZapGate(self._zmq)
        assert self._zap is not None
        kind = {"router": RouterBridge, "dealer": DealerBridge}.get(config.socket, ZmqBridge)
        return kind(
            config,
            self._host,
            configured=configured,
            max_body=self._max_body,
            context=self._zmq,
            zap=self._zap,
        )

    async def _start(self, config: BridgeConfig, *, configured: bool) -> AnyBridge:
        bridge = self._make(config, configured=configured)
        self._bridges[config.name] = bridge
        solo = self._host.engine.solo(f"bridge:{config.name}")
        self._solos[config.name] = solo
        try:
            held = await solo.take()
        except ServiceUnavailable:
            held = False  # the next round of claims decides
        if held:
            await self._run(bridge)
        else:
            log.info("bridge %s: another gateway node runs it; this one stands by", bridge.name)
        self._following[config.name] = asyncio.create_task(
            self._follow(bridge, solo, held), name=f"bridge-{config.name}-claim"
        )
        return bridge

    async def _run(self, bridge: AnyBridge) -> None:
        config = bridge.config
        await bridge.start()
        log.info(
            "bridge %s started (%s %s, feed %s)",
            config.name,
            config.kind,
            config.direction,
            config.feed,
        )

    async def _follow(self, bridge: AnyBridge, solo: Solo, held: bool) -> None:
        """Start the bridge when this node takes its claim, stop it when it loses it."""
        while True:
            now = await solo.changed()
            if now == held:
                continue
            held = now
            try:
                if held:
                    await self._run(bridge)
                else:
                    log.warning("bridge %s: another gateway node runs it now", bridge.name)
                    await bridge.stop()
            except Exception:  # the next change tries again; the others run on
                log.exception("bridge %s could not be started or stopped", bridge.name)

    async def _forget(self, bridge: AnyBridge) -> None:
        """Stop the bridge and give up its claim."""
        following = self._following.pop(bridge.name, None)
        if following is not None:
            following.cancel()
            await asyncio.gather(following, return_exceptions=True)
        try:
            await bridge.stop()
        except Exception:  # one bridge's failure must not keep the others running
            log.exception("bridge %s did not stop cleanly", bridge.name)
        solo = self._solos.pop(bridge.name, None)
        if solo is not None:
            try:
                await solo.release()
            except ServiceUnavailable as exc:
                log.warning("bridge %s: its claim was not freed (%s)", bridge.name, exc.reason)

    # ------------------------------------------------------------ run-time changes
    async def create(self, config: BridgeConfig) -> tuple[AnyBridge, bool]:
        """A new bridge (created True), or the same definition again (created False)."""
        async with self._lock:
            existing = self._bridges.get(config.name)
            if existing is not None:
                if existing.config == config:
                    return existing, False
                raise Conflict(f"a different bridge named {config.name!r} exists")
            host = self._host
            if not await self._public(config.feed):
                raise BadRequest(f"no feed named {config.feed!r} to bridge")
            if config.direction == "in" and config.feed == host.system_feed:
                raise Forbidden(f"feed {config.feed!r} is the system feed: only bridges out of it")
            if config.max_messages > host.max_pipe_messages:
                raise BadRequest(f"max_messages may be at most {host.max_pipe_messages}")
            if config.max_bytes > host.max_pipe_bytes:
                raise BadRequest(f"max_bytes may be at most {host.max_pipe_bytes}")
            dead = config.dead_letter
            if dead and not await self._public(dead):
                raise BadRequest(f"no feed named {dead!r} for dead letters")
            if isinstance(config, ZmqBridgeConfig):
                if config.socket == "dealer" and not await self._public(config.reply_feed):
                    raise BadRequest(f"no feed named {config.reply_feed!r} for replies")
                self._check_endpoints(config)
            bridge = await self._start(config, configured=False)
            await self._save()
            return bridge, True

    async def _public(self, name: str) -> bool:
        """Whether a public feed is named ``name``."""
        try:
            feed = await self._host.engine.feed(None, name)
        except NotFound:
            return False
        return feed.name == name

    def _check_endpoints(self, config: ZmqBridgeConfig) -> None:
        """409 for an endpoint another ZeroMQ bridge of this gateway binds."""
        if not config.bind:
            return
        for other in self._bridges.values():
            if isinstance(other, ZmqBridge) and other.config.bind:
                shared = set(config.endpoints) & set(other.config.endpoints)
                shared.discard("")
                if any("*" not in endpoint for endpoint in shared):
                    raise Conflict(f"bridge {other.name!r} binds {', '.join(sorted(shared))}")

    async def delete(self, name: str, *, discard: bool) -> int:
        """Stop and forget a run-time bridge; returns how many waiting messages went
        with its pipe. Refused (409) while messages wait, unless ``discard``."""
        async with self._lock:
            bridge = self.get(name)
            if bridge.configured:
                raise Forbidden(f"bridge {name!r} is in the configuration file: remove it there")
            waiting = bridge.backlog()
            if waiting and not discard:
                raise Conflict(
                    f"bridge {name!r} has {waiting} messages waiting to be sent; "
                    "delete with ?discard=true to drop them"
                )
            await self._forget(bridge)
            del self._bridges[name]
            await bridge.forget()
            engine, owner = self._host.engine, owner_of(name)
            for pipe in await engine.pipes(owner):
                await engine.delete_pipe(owner, pipe.key)  # committed when it returns
            await self._save()
            return waiting

    # ------------------------------------------------------------ the state file
    async def _save(self) -> None:
        if self._state_file is None:
            return
        kept = [b.config.stored() for b in self._bridges.values() if not b.configured]
        await asyncio.to_thread(self._write, kept)

    def _write(self, kept: list[dict[str, Any]]) -> None:
        assert self._state_file is not None
        path = self._state_file
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_name(path.name + ".tmp")
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump({"bridges": kept}, handle, indent=1)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)

    def _load(self) -> list[BridgeConfig]:
        assert self._state_file is not None
        try:
            data = json.loads(self._state_file.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return []
        except (OSError, ValueError) as exc:
            log.error("cannot read %s (%s): run-time bridges not restored", self._state_file, exc)
            return []
        kept = []
        for entry in data.get("bridges", []) if isinstance(data, dict) else []:
            try:
                kept.append(parse(entry))
            except ValueError as exc:
                log.error("a stored bridge is not valid any more (%s): skipped", exc)
        return kept
