"""The gateway's bridges: those declared in the configuration file and those made at
run time through the admin resource, which are kept so they come back after a restart:
with the embedded engine in ``<data>/bridges.json`` (mode 0600: broker passwords,
:class:`FileKept`); on a cluster in the engine's settings (``bridge/<name>``,
:class:`EngineKept`), shared by every node: a bridge made through one node is run by
one node of them all, listed by each, and deleted through any.

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
import contextlib
import json
import logging
import os
import secrets
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import zmq.asyncio

from feeds.service import SETTING_MAX, EngineService, Solo
from restms.errors import (
    BadRequest,
    Conflict,
    Forbidden,
    NotFound,
    PayloadTooLarge,
    ServiceUnavailable,
)

from .amqp import AmqpBridge
from .base import Host
from .common import owner_of
from .config import AmqpBridgeConfig, BridgeConfig, ZmqBridgeConfig, parse
from .federation.config import FederationConfig
from .federation.link import FederationLink
from .federation.links import federation_link
from .zeromq import ZapGate, ZmqBridge
from .zmq_rpc import DealerBridge, RouterBridge

log = logging.getLogger(__name__)

AnyBridge = AmqpBridge | ZmqBridge | FederationLink

MAX_KEPT = 100  # run-time bridges a gateway (all the nodes of a cluster) keeps
# Characters of a run-time bridge's definition as kept (JSON, secrets included): an
# engine setting holds it with a little around it (EngineKept).
MAX_DEFINITION = SETTING_MAX - 96
WATCH = 1.0  # seconds between a cluster node's looks at the shared definitions
CLAIM_WAIT = 15.0  # seconds a delete waits for the node running the bridge to stop it
PREFIX = "bridge/"  # the engine settings that hold run-time bridges: bridge/<name>


class Kept(Protocol):
    """Where the run-time bridges' definitions are kept."""

    shared: bool  # other nodes change them too: each node looks again every WATCH

    async def load(self) -> dict[str, BridgeConfig]:
        """Every definition kept, by name, in the order they are started."""
        ...

    async def add(self, config: BridgeConfig) -> bool:
        """Keep ``config``: True when it is new, False when the same definition was kept
        already; 409 when another holds its name (of two nodes adding one name at once,
        one wins)."""
        ...

    async def drop(self, config: BridgeConfig) -> bool:
        """Forget the definition kept under ``config.name`` if it is ``config``: whether
        this call forgot it (of two deletes at once, one does)."""
        ...


class FileKept:
    """One gateway's run-time bridges, in ``path`` (None: in memory, for this run)."""

    shared = False

    def __init__(self, path: Path | None) -> None:
        self._path = path
        self._kept: dict[str, BridgeConfig] | None = None

    async def load(self) -> dict[str, BridgeConfig]:
        if self._kept is None:
            read = await asyncio.to_thread(self._read) if self._path else []
            self._kept = {config.name: config for config in read}
        return dict(self._kept)

    async def add(self, config: BridgeConfig) -> bool:
        kept = await self.load()
        held = kept.get(config.name)
        if held is not None:
            if held == config:
                return False
            raise Conflict(f"a different bridge named {config.name!r} exists")
        kept[config.name] = config
        await self._save(kept)
        return True

    async def drop(self, config: BridgeConfig) -> bool:
        kept = await self.load()
        if kept.get(config.name) != config:
            return False
        del kept[config.name]
        await self._save(kept)
        return True

    async def _save(self, kept: dict[str, BridgeConfig]) -> None:
        if self._path is not None:
            await asyncio.to_thread(self._write, [c.stored() for c in kept.values()])
        self._kept = kept

    def _write(self, kept: list[dict[str, Any]]) -> None:
        assert self._path is not None
        path = self._path
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_name(path.name + ".tmp")
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump({"bridges": kept}, handle, indent=1)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)

    def _read(self) -> list[BridgeConfig]:
        assert self._path is not None
        try:
            data = json.loads(self._path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return []
        except (OSError, ValueError) as exc:
            log.error("cannot read %s (%s): run-time bridges not restored", self._path, exc)
            return []
        kept = []
        for entry in data.get("bridges", []) if isinstance(data, dict) else []:
            try:
                kept.append(parse(entry))
            except ValueError as exc:
                log.error("a stored bridge is not valid any more (%s): skipped", exc)
        return kept


class EngineKept:
    """The run-time bridges of every node sharing ``engine``: a setting each,
    ``bridge/<name>``, holding ``{"made": <random>, "definition": {...}}`` with its
    secrets (as bridges.json holds them; the engine's own access control guards
    them). ``made`` tells the node that added a definition from one that found the
    same definition there already (201 against 200)."""

    shared = True

    def __init__(self, engine: EngineService) -> None:
        self._engine = engine
        # Every node reads the definitions every second: each is parsed (and checked,
        # and an invalid one logged) only when its value changed, forgotten once gone.
        self._parsed: dict[str, tuple[str, BridgeConfig | None]] = {}

    async def load(self) -> dict[str, BridgeConfig]:
        kept = {}
        parsed = {}
        for key, value in await self._engine.list_settings(PREFIX):
            known = self._parsed.get(key)
            if known is not None and known[0] == value:
                config = known[1]
            else:
                config = self._parse(key, value)
            parsed[key] = (value, config)
            if config is not None:
                kept[config.name] = config
        self._parsed = parsed
        return kept

    async def add(self, config: BridgeConfig) -> bool:
        value = json.dumps(
            {"made": secrets.token_hex(8), "definition": config.stored()}, separators=(",", ":")
        )
        assert len(value) <= SETTING_MAX, "MAX_DEFINITION leaves room for the envelope"
        key = PREFIX + config.name
        held = await self._engine.keep_setting(key, value, only_new=True)
        if held == value:
            return True
        if self._parse(key, held) == config:
            return False
        raise Conflict(f"a different bridge named {config.name!r} exists")

    async def drop(self, config: BridgeConfig) -> bool:
        key = PREFIX + config.name
        held = await self._engine.setting(key)
        if held is None or self._parse(key, held) != config:
            return False
        return await self._engine.drop_setting(key, only=held)

    @staticmethod
    def _parse(key: str, value: str) -> BridgeConfig | None:
        """The definition ``value`` holds (logged by name only: it holds secrets)."""
        try:
            config = parse(json.loads(value)["definition"])
        except (ValueError, KeyError, TypeError):
            log.error("run-time bridge %s is not valid any more: skipped", key)
            return None
        return config if PREFIX + config.name == key else None


class Registry:
    """Every bridge of one gateway, by name."""

    def __init__(
        self,
        host: Host,
        configured: Sequence[BridgeConfig],
        *,
        kept: Kept,
        max_body: int,
    ) -> None:
        self._host = host
        self._configured = tuple(configured)
        self._kept = kept
        self._max_body = max_body
        self._watching: asyncio.Task[None] | None = None  # a cluster node's look at kept
        self._shadowed: set[str] = set()  # run-time names a configured bridge takes
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
        """Start the configured bridges, then the ones kept from earlier runs (or made
        through other nodes); ``gateway_id`` is the name federation links give this
        gateway (docs/FEDERATION.md)."""
        self.gateway_id = gateway_id
        for config in self._configured:
            await self._start(config, configured=True)
        try:
            await self._sync()
        except ServiceUnavailable as exc:  # the next look (on a cluster) tries again
            log.warning("run-time bridges not read yet: %s", exc.reason)
        if self._kept.shared:
            self._watching = asyncio.create_task(self._watch(), name="bridges-kept")

    async def stop(self) -> None:
        if self._watching is not None:
            self._watching.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watching
            self._watching = None
        for bridge in reversed(list(self._bridges.values())):
            await self._forget(bridge)
        self._bridges.clear()
        if self._zap is not None:
            self._zap.stop()
        if self._zmq is not None:
            # every socket is closed; term() waits for their linger, so not on the loop
            await asyncio.to_thread(self._zmq.term)
            self._zmq = self._zap = None

    async def _watch(self) -> None:
        """A cluster node: follow the run-time bridges other nodes add and delete."""
        while True:
            await asyncio.sleep(WATCH)
            try:
                await self._sync()
            except ServiceUnavailable:
                continue  # the engine fails over: the next look
            except Exception:  # the next look tries again; the bridges run on
                log.exception("run-time bridges could not be read")

    async def _sync(self) -> None:
        """Start each kept bridge this node has not, forget each it has that is no
        longer kept (deleted, or made again differently, through another node)."""
        async with self._lock:
            kept = await self._kept.load()
            for name, bridge in list(self._bridges.items()):
                if not bridge.configured and kept.get(name) != bridge.config:
                    log.info("bridge %s was deleted through another gateway node", name)
                    await self._forget(bridge)
                    del self._bridges[name]
            for name, config in kept.items():
                if name not in self._bridges:
                    await self._start(config, configured=False)
                elif self._bridges[name].configured and name not in self._shadowed:
                    self._shadowed.add(name)
                    log.warning("bridge %s is configured now; its run-time copy is dropped", name)
                    if not self._kept.shared:  # (one cluster node's file may differ)
                        await self._kept.drop(config)

    def _make(self, config: BridgeConfig, *, configured: bool) -> AnyBridge:
        if isinstance(config, AmqpBridgeConfig):
            return AmqpBridge(config, self._host, configured=configured, max_body=self._max_body)
        if isinstance(config, FederationConfig):
            return federation_link(
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
            size = len(json.dumps(config.stored(), separators=(",", ":")))
            if size > MAX_DEFINITION:
                raise PayloadTooLarge(
                    f"a bridge definition may take {MAX_DEFINITION} characters as kept; "
                    f"this one takes {size}"
                )
            if len(await self._kept.load()) >= MAX_KEPT:
                raise Conflict(f"the gateway keeps at most {MAX_KEPT} run-time bridges")
            created = await self._kept.add(config)  # False: added through another node
            return await self._start(config, configured=False), created

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

    async def definition(self, name: str) -> BridgeConfig:
        """The definition of the bridge named ``name``: this node's, or on a cluster one
        made through another node that this node has not started yet (404: none)."""
        bridge = self._bridges.get(name)
        if bridge is not None:
            return bridge.config
        config = (await self._kept.load()).get(name) if self._kept.shared else None
        if config is None:
            raise NotFound(f"no bridge named {name!r}")
        await self._sync()  # start it here now rather than at the next look
        return config

    async def delete(self, name: str, *, discard: bool) -> int:
        """Stop and forget a run-time bridge; returns how many waiting messages went
        with its pipe. Refused (409) while messages wait, unless ``discard``.

        On a cluster the node running it may be another: the definition is dropped
        first, so each node forgets the bridge at its next look, and its pipe is
        deleted once this node holds the bridge's claim, when nobody runs it."""
        async with self._lock:
            bridge = self._bridges.get(name)
            if bridge is not None and bridge.configured:
                raise Forbidden(f"bridge {name!r} is in the configuration file: remove it there")
            config = (await self._kept.load()).get(name)
            if config is None:
                raise NotFound(f"no bridge named {name!r}")
            engine, owner = self._host.engine, owner_of(name)
            held = sum(pipe.held for pipe in await engine.pipes(owner))
            waiting = max(held, bridge.backlog() if bridge is not None else 0)
            if waiting and not discard:
                raise Conflict(
                    f"bridge {name!r} has {waiting} messages waiting to be sent; "
                    "delete with ?discard=true to drop them"
                )
            if not await self._kept.drop(config):
                raise NotFound(f"no bridge named {name!r}")  # deleted through another node
            if bridge is not None:
                await self._forget(bridge)
                del self._bridges[name]
            else:
                bridge = self._make(config, configured=False)
            solo = engine.solo(f"bridge:{name}")
            try:
                await self._alone(name, solo)
                await bridge.forget()
                for pipe in await engine.pipes(owner):
                    await engine.delete_pipe(owner, pipe.key)  # committed when it returns
            finally:
                await solo.release()
            return waiting

    @staticmethod
    async def _alone(name: str, solo: Solo) -> None:
        """Wait (a while) for this node to hold ``solo``: then no node runs the bridge
        (the one that did stopped it once it saw its definition gone, or died and its
        claim ran out). Past the wait its pipe goes anyway: a node that still runs
        the bridge stops it at its next look at the definitions."""
        try:
            async with asyncio.timeout(CLAIM_WAIT):
                held = await solo.take()
                while not held:
                    held = await solo.changed()
        except TimeoutError:
            log.warning("bridge %s: another gateway node still ran it when deleted", name)
