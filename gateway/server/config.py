"""Gateway configuration: defaults, then a TOML file, then ``RESTMS_*``, then CLI flags.

Every scalar key of :class:`Config` may appear at the top level of the TOML file
(or in a ``[gateway]`` table) and be overridden by the environment variable
``RESTMS_<KEY>`` (``RESTMS_PORT=9000``) and then by command-line flags. Domains and
configured feeds are TOML arrays of tables (``[[domains]]``, ``[[feeds]]``).
Unknown keys are an error: a typo must not silently fall back to a default.
"""

from __future__ import annotations

import dataclasses
import os
import re
import tomllib
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from auth import GUEST, User, cluster
from auth.clients import Client
from bridges.checks import NAME as BRIDGE_NAME
from bridges.checks import redact
from bridges.config import BridgeConfig
from bridges.config import parse as parse_bridge
from feeds.service import DEFAULT_DOMAIN, EngineConfig, FeedConfig
from gateway.admin.bridge_guard import parse_bridge_allow
from gateway.server.cors import Cors
from gateway.server.cors import make as make_cors
from gateway.server.hosts import Hosts
from gateway.server.proxies import parse_trusted
from gateway.webhooks.guard import parse_allow, split_allow
from restms.specs import MessageLimits
from restms.webhook import WebhookLimits
from restms.xmlcodec import CodecLimits

MAX_WORKERS = 256  # gateway processes one serve command may start
_NAMESPACE = re.compile(r"[A-Za-z0-9._-]{1,64}")  # inside a Redis hash tag: no braces


class ConfigError(Exception):
    """The configuration cannot be used; the message says which key and why."""


@dataclass(frozen=True, slots=True, kw_only=True)
class IssuerConfig:
    """An external OAuth issuer whose JWTs the gateway accepts."""

    issuer: str
    audience: str = ""  # "" : the gateway's audience
    jwks_url: str = ""  # keys fetched from here (refreshed on an unknown kid), or
    jwks_file: str = ""  # a JWKS document on disk
    algorithms: tuple[str, ...] = ("RS256", "ES256", "EdDSA")
    prefix: str | None = None  # principal = prefix + sub; None: the issuer's host and "/"

    def __post_init__(self) -> None:
        if not self.issuer:
            raise ConfigError("[[issuers]] needs an issuer")
        if bool(self.jwks_url) == bool(self.jwks_file):
            raise ConfigError(f"issuer {self.issuer}: give exactly one of jwks_url, jwks_file")
        bad = set(self.algorithms) - {"RS256", "ES256", "EdDSA"}
        if bad or not self.algorithms:
            raise ConfigError(f"issuer {self.issuer}: algorithms must be among RS256, ES256, EdDSA")

    @property
    def principal_prefix(self) -> str:
        if self.prefix is not None:
            return self.prefix
        host = urllib.parse.urlsplit(self.issuer).netloc or self.issuer
        return host + "/"


@dataclass(frozen=True, slots=True, kw_only=True)
class Config:
    host: str = "127.0.0.1"
    port: int = 8080
    data_dir: str = "./var"
    insecure: bool = False  # anonymous and guest requests honoured from any address (unsafe)
    log_level: str = "INFO"
    access_log: bool = False
    shutdown_grace: float = 10.0  # seconds requests in flight get to finish after SIGTERM
    # HTTP limits
    max_body: int = 4 * 1024 * 1024  # bytes; 413 above (S3)
    max_wait: float = 300.0  # seconds an asynclet or When-* GET may wait (A9)
    expired_wait_status: int = 503  # 500 for older clients (A9, L16)
    stream_max: float = 3600.0  # seconds a stream pipe or SSE response stays open
    heartbeat: float = 15.0  # seconds between SSE keep-alive comments
    # WebSocket on a pipe (docs/BROWSER.md)
    websocket_window: int = 100  # messages sent and not yet acknowledged, per socket, at most
    websocket_max_frame: int = 1024 * 1024  # bytes in one client frame; larger closes (1009)
    websocket_max_per_principal: int = 100  # WebSockets open at once per principal
    websocket_heartbeat: float = 30.0  # seconds between pings; no pong in half that: closed
    websocket_max_life: float = 3600.0  # seconds a WebSocket stays open
    websocket_max_errors: int = 10  # refused frames in a row before the socket closes (1008)
    max_messages_per_request: int = 10_000
    max_headers_per_message: int = 128
    max_header_bytes: int = 8192  # one message header's name and value, in characters
    max_contents_per_message: int = 16
    max_depth: int = 16
    max_elements: int = 200_000
    max_attributes: int = 64  # on one element (a JSON object's keys); more gets 400
    # engine
    legacy_default_feed_type: str = ""  # "direct" for older clients (L4)
    max_pipe_messages: int = 10_000
    max_pipe_bytes: int = 64 * 1024 * 1024
    overflow: str = "skip"  # what a full pipe does: "skip", "reject" or "drop-oldest"
    max_feed_queue: int = 10_000
    max_feed_queue_bytes: int = 64 * 1024 * 1024
    listing_cap: int = 1_000
    staged_ttl: float = 300.0
    max_staged_bytes: int = 256 * 1024 * 1024
    max_staged_bytes_per_principal: int = 64 * 1024 * 1024  # one principal's share of it
    lease: float = 300.0  # seconds a fetched message may go unacknowledged (0: forever)
    max_deliveries: int = 5  # fetches before a message goes to the dead-letter feed
    dead_letter_feed: str = "dead-letter"  # "": dead letters are discarded
    system_feed: str = "restms.system"  # management events (docs/EVENTS.md); "": none
    system_feed_type: str = "topic"  # "headers": joins select on the events' headers
    events_interval: float = 10.0  # seconds: repeated events about one object coalesce
    pipe_idle_timeout: float = 600.0  # seconds before an untouched pipe is collected (0: never)
    dedup_window: float = 600.0  # seconds a feed remembers message_ids (0: no deduplication)
    dedup_max: int = 10_000  # message_ids a feed remembers at most
    memory_budget: int = 64 * 1024 * 1024  # bytes of pipe messages in memory; then disk
    idempotency_max: int = 10_000  # replies kept for Idempotency-Key repeats
    idempotency_bytes: int = 64 * 1024 * 1024  # bytes of those replies at most
    sweep_interval: float = 1.0  # seconds between lease, idle-pipe and staged-content sweeps
    # authentication and access (docs/AUTH.md)
    anonymous: bool = True  # a request without credentials from loopback acts as guest
    guest_user: bool = True  # HTTP Basic guest/guest is honoured from loopback
    guest_scopes: str = "restms:read restms:publish restms:subscribe"
    builtin_issuer: bool = True  # run the built-in authorization server and trust its tokens
    oauth_issuer: str = ""  # the built-in server's "iss"; "" derives it from scheme, host, port
    audience: str = "restms"  # the "aud" every accepted JWT must carry
    token_ttl: float = 600.0  # seconds a token from the built-in server lives
    token_leeway: float = 30.0  # seconds of clock skew allowed on exp, nbf, iat
    jwks_refresh: float = 30.0  # seconds at least between JWKS fetches for unknown kids
    introspection_url: str = ""  # RFC 7662 endpoint for opaque tokens ("" : none)
    introspection_client_id: str = ""
    introspection_client_secret: str = field(default="", repr=False)
    token_cache: int = 100_000  # verified tokens remembered until they expire
    # abuse limits (docs/AUTH.md)
    rate_limit: float = 1000.0  # requests per second per principal (0: no limit)
    rate_burst: int = 2000  # requests a principal may make at once above the rate
    # failed secret checks per account (user or client id): regained per second, at once
    account_failure_rate: float = 0.1  # (0: no per-account bound)
    account_failure_burst: int = 10
    max_feeds_per_principal: int = 100  # public and private feeds a principal created
    max_pipes_per_principal: int = 1000
    max_joins_per_principal: int = 10_000
    max_waits_per_principal: int = 100  # asynclets, long-polls and streams open at once
    max_connections: int = 10_000  # open client connections in all
    max_connections_per_ip: int = 1000
    trusted_proxies: str = ""  # whose X-Forwarded-* headers are believed (OPERATIONS.md)
    public_url: str = ""  # the origin every URI names, https://gw.example.com; "": the Host's
    allowed_hosts: str = ""  # Host patterns served besides the gateway's addresses; 421 else
    # pages of other origins (docs/BROWSER.md, "Pages on other origins")
    cors_origins: str = ""  # origins and patterns whose pages may call; "": the gateway's own
    cors_credentials: bool = False  # their pages may send cookies and HTTP auth (never with *)
    cors_max_age: int = 600  # seconds a browser may keep a preflight's answer
    websocket_origins: str = ""  # pages that may open WebSockets; "": as cors_origins
    # compression (docs/OPERATIONS.md, "Compression")
    compression: bool = True  # compress replies for clients that accept it
    compression_min_bytes: int = 1024  # replies smaller than this are sent as they are
    max_line_size: int = 8190  # bytes in the request line
    max_field_size: int = 8190  # bytes in one header
    max_headers: int = 100  # headers in one request
    header_timeout: float = 10.0  # seconds a client has to send a whole request head
    body_timeout: float = 60.0  # seconds a client has to send a whole request body
    keepalive_timeout: float = 75.0  # seconds an idle keep-alive connection stays open
    tls_cert: str = ""  # PEM certificate chain: with tls_key, the gateway serves HTTPS
    tls_key: str = field(default="", repr=False)
    # the engine (docs/CLUSTER.md): "embedded" in this process, or "redis" shared by nodes
    engine: str = "embedded"
    redis_url: str = field(default="redis://127.0.0.1:7101", repr=False)  # a seed node
    redis_namespace: str = "restms"  # key prefix: several gateways may share one cluster
    redis_start_wait: float = 30.0  # seconds a starting node waits for the cluster to be ready
    workers: int = 1  # gateway processes on one port (SO_REUSEPORT); above 1 needs "redis"
    # durability (docs/DURABILITY.md)
    store: str = "sqlite"  # "memory": nothing survives a restart
    store_sync: str = "full"  # SQLite synchronous: "full" survives power loss, "normal" a crash
    store_busy_timeout: float = 5.0  # seconds a commit waits for a write lock another holds
    journal_interval: float = 0.05  # seconds; lazy records (positions) wait at most this long
    # webhook pipes (docs/WEBHOOKS.md): each option's default, and the most a pipe may ask
    webhook_allow: str = ""  # CIDRs and host names callbacks may reach despite the SSRF guard
    webhook_concurrency: int = 1  # messages delivered at once (1: in order)
    webhook_concurrency_limit: int = 16
    webhook_timeout: float = 10.0  # seconds a receiver has to answer 2xx
    webhook_timeout_limit: float = 60.0
    webhook_max_attempts: int = 10  # attempts at a message before it is dead-lettered
    webhook_max_attempts_limit: int = 100
    webhook_max_age: float = 86_400.0  # seconds after its arrival a message is given up
    webhook_max_age_limit: float = 604_800.0
    webhook_backoff_base: float = 1.0  # seconds: the first retry waits up to this long
    webhook_backoff_cap: float = 300.0  # seconds any retry waits at most
    webhook_connections: int = 100  # connections open to receivers at once, all pipes
    webhook_response_max: int = 65_536  # bytes of a receiver's answer read at most
    # traffic mirror (docs/ANALYTICS.md, "The mirror")
    mirror: bool = True  # mirror every message event into the lake
    mirror_lake: str = ""  # directory or URI (s3a://, hdfs://, ...); "": <data_dir>/lake
    mirror_queue: int = 100_000  # events waiting for the writer at most; more are dropped
    mirror_rotate_bytes: int = 64 * 1024 * 1024  # a lake file is closed at this size
    mirror_rotate_seconds: float = 3.0  # ... or at this age (how soon traffic shows)
    mirror_spill_bytes: int = 1024 * 1024 * 1024  # events on disk while the writer is behind
    mirror_compact_after: float = 300.0  # seconds before closed files are compacted (0: never)
    mirror_retention_days: float = 30.0  # lake files older than this are deleted (0: kept)
    # analytics (docs/ANALYTICS.md): Spark in a worker process, started on the first query
    analytics: bool = True  # answer analytics queries (off: 503 and no Spark worker ever)
    analytics_master: str = "local[*]"  # Spark master URL: local[N], spark://..., k8s://...
    analytics_cache_seconds: float = 30.0  # answers are reused this long (0: no cache)
    analytics_timeout: float = 120.0  # seconds a query may take; then 504, worker restarted
    analytics_start_timeout: float = 180.0  # seconds the worker has to start Spark
    analytics_max_pending: int = 8  # queries waiting for the worker at most; then 503
    analytics_checkpoint: str = ""  # streaming checkpoint; "": <data_dir>/analytics/checkpoint
    analytics_stream: bool = True  # run the streaming job of rolling aggregates
    analytics_stream_interval: float = 2.0  # seconds between its micro-batches
    analytics_stream_files: int = 100  # new lake files per micro-batch at most
    analytics_partitions: int = 4  # spark.sql.shuffle.partitions
    analytics_memory: str = "1g"  # spark.driver.memory of the worker
    analytics_preload: bool = True  # start the worker in the background with the gateway
    analytics_idle_seconds: float = 0.0  # an idle worker is stopped after this long (0: never)
    # metrics and readiness (docs/METRICS.md)
    metrics_access: str = "scope"  # who may GET /metrics: scope, loopback or open
    ready_commit_timeout: float = 2.0  # seconds /readyz waits for a test commit
    ready_needs_bridges: bool = False  # a bridge whose link is not up: not ready
    # tracing (docs/TRACING.md): OpenTelemetry spans, W3C trace context in message headers
    tracing: bool = False
    otlp_endpoint: str = ""  # OTLP/HTTP traces URL (http://collector:4318/v1/traces); "": none
    tracing_service: str = "restms-gateway"  # the spans' service.name
    tracing_sample: float = 1.0  # share of new traces recorded (a caller's decision is kept)
    ready_needs_analytics: bool = False  # an analytics worker that is not ready: not ready
    domains: tuple[tuple[str, str], ...] = ((DEFAULT_DOMAIN, "Default domain"),)
    feeds: tuple[FeedConfig, ...] = field(default=())
    # [[domains]] principals = [...]: who each domain admits (absent: everyone)
    domain_principals: tuple[tuple[str, tuple[str, ...]], ...] = ()
    issuers: tuple[IssuerConfig, ...] = ()  # [[issuers]]: external token issuers trusted
    clients: tuple[Client, ...] = ()  # [[clients]]: built-in server clients
    users: tuple[User, ...] = ()  # [[users]]: HTTP Basic users
    bridges: tuple[BridgeConfig, ...] = ()  # [[bridges]]: AMQP, ZeroMQ, federation links
    # the name federation links give this gateway; "": made once and kept by the engine
    gateway_id: str = ""
    # CIDRs and host names federation links made at run time may reach despite the guard
    federation_allow: str = ""
    # the same for AMQP and ZeroMQ bridges made at run time, and what they may bind on
    bridge_allow: str = ""
    # Derived once, in __post_init__: the hot path must not rebuild them per request.
    codec: CodecLimits = field(init=False, repr=False, compare=False)
    limits: MessageLimits = field(init=False, repr=False, compare=False)
    hosts: Hosts = field(init=False, repr=False, compare=False)
    cors: Cors = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ConfigError(f"port {self.port} is out of range")
        if self.expired_wait_status not in (500, 503):
            raise ConfigError("expired_wait_status must be 500 or 503")
        if self.legacy_default_feed_type not in ("", "direct"):
            raise ConfigError('legacy_default_feed_type must be "" or "direct"')
        if self.store not in ("sqlite", "memory"):
            raise ConfigError('store must be "sqlite" or "memory"')
        self._check_engine()
        if self.store_sync not in ("full", "normal"):
            raise ConfigError('store_sync must be "full" or "normal"')
        if not 0 <= self.store_busy_timeout <= 60:
            raise ConfigError("store_busy_timeout must be from 0 to 60 seconds")
        keys = ("max_body", "max_wait", "stream_max", "heartbeat", "sweep_interval")
        sockets = ("websocket_heartbeat", "websocket_max_life")
        for key in (*keys, *sockets, "journal_interval", "shutdown_grace"):
            if getattr(self, key) <= 0:
                raise ConfigError(f"{key} must be positive")
        if self.log_level.upper() not in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"):
            raise ConfigError(f"log_level {self.log_level!r} is not a logging level")
        self._check_tracing()
        counts = (
            "max_messages_per_request",
            "max_headers_per_message",
            "max_header_bytes",
            "max_contents_per_message",
            "max_elements",
            "max_attributes",
            "idempotency_max",
            "idempotency_bytes",
            "websocket_window",
            "websocket_max_frame",
            "websocket_max_per_principal",
            "websocket_max_errors",
        )
        for key in counts:
            if getattr(self, key) < 1:
                raise ConfigError(f"{key} must be at least 1")
        if DEFAULT_DOMAIN not in (name for name, _ in self.domains):
            raise ConfigError(f"[[domains]] must include the {DEFAULT_DOMAIN!r} domain (U3)")
        try:
            self.engine_config()
            codec = CodecLimits(
                max_depth=self.max_depth,
                max_elements=self.max_elements,
                max_attributes=self.max_attributes,
            )
        except ValueError as exc:
            raise ConfigError(str(exc)) from exc
        object.__setattr__(self, "codec", codec)
        limits = MessageLimits(
            max_messages=self.max_messages_per_request,
            max_headers=self.max_headers_per_message,
            max_contents=self.max_contents_per_message,
            max_header_bytes=self.max_header_bytes,
        )
        object.__setattr__(self, "limits", limits)
        if bool(self.tls_cert) != bool(self.tls_key):
            raise ConfigError("tls_cert and tls_key must be given together")
        floats = ("token_ttl", "header_timeout", "body_timeout", "keepalive_timeout")
        for key in floats:
            if getattr(self, key) <= 0:
                raise ConfigError(f"{key} must be positive")
        for key in ("token_leeway", "jwks_refresh", "rate_limit", "account_failure_rate"):
            if getattr(self, key) < 0:
                raise ConfigError(f"{key} must not be negative")
        caps = (
            "rate_burst",
            "account_failure_burst",
            "token_cache",
            "max_feeds_per_principal",
            "max_pipes_per_principal",
            "max_joins_per_principal",
            "max_waits_per_principal",
            "max_connections",
            "max_connections_per_ip",
            "max_line_size",
            "max_field_size",
            "max_headers",
        )
        for key in caps:
            if getattr(self, key) < 1:
                raise ConfigError(f"{key} must be at least 1")
        if self.token_ttl < 1:
            raise ConfigError("token_ttl must be at least one second")
        issuer = urllib.parse.urlsplit(self.oauth_issuer)
        if self.oauth_issuer and (
            issuer.scheme not in ("http", "https")
            or not issuer.netloc
            or issuer.query
            or issuer.fragment
        ):
            raise ConfigError("oauth_issuer must be an http(s) URL without query or fragment")
        taken = [u.name for u in self.users] + [c.client_id for c in self.clients]
        if GUEST in taken:
            raise ConfigError(f"{GUEST!r} is the loopback guest: name users and clients otherwise")
        if self.introspection_url and not self.introspection_client_id:
            raise ConfigError("introspection_url needs introspection_client_id")
        if self.gateway_id and not BRIDGE_NAME.fullmatch(self.gateway_id):
            raise ConfigError("gateway_id must be 1-64 of A-Z a-z 0-9 . _ -")
        names = [b.name for b in self.bridges]
        if len(set(names)) != len(names):
            raise ConfigError("two [[bridges]] have the same name")
        for bridge in self.bridges:  # events are the gateway's alone (docs/EVENTS.md)
            if self.system_feed and bridge.direction == "in" and bridge.feed == self.system_feed:
                raise ConfigError(f"bridge {bridge.name!r} publishes into the system feed")
        try:
            parse_trusted(self.trusted_proxies)
            parse_allow(split_allow(self.webhook_allow))
            parse_allow(split_allow(self.federation_allow), "federation_allow")
            parse_bridge_allow(self.bridge_allow)
            object.__setattr__(self, "hosts", Hosts(self.public_url, self.allowed_hosts, self.host))
            cors = make_cors(
                self.cors_origins,
                self.websocket_origins,
                credentials=self.cors_credentials,
                max_age=self.cors_max_age,
                public=self.hosts.public,
            )
            object.__setattr__(self, "cors", cors)
        except ValueError as exc:
            raise ConfigError(str(exc)) from exc
        if self.cors_max_age < 0 or self.compression_min_bytes < 0:
            raise ConfigError("cors_max_age and compression_min_bytes must not be negative")
        if self.webhook_connections < 1 or self.webhook_response_max < 1:
            raise ConfigError("webhook_connections and webhook_response_max must be at least 1")
        if self.mirror_queue < 1 or self.mirror_rotate_bytes < 1:
            raise ConfigError("mirror_queue and mirror_rotate_bytes must be at least 1")
        if self.mirror_rotate_seconds <= 0:
            raise ConfigError("mirror_rotate_seconds must be positive")
        for key in ("mirror_spill_bytes", "mirror_compact_after", "mirror_retention_days"):
            if getattr(self, key) < 0:
                raise ConfigError(f"{key} must not be negative")
        for key in ("analytics_timeout", "analytics_start_timeout", "analytics_stream_interval"):
            if getattr(self, key) <= 0:
                raise ConfigError(f"{key} must be positive")
        for key in ("analytics_cache_seconds", "analytics_idle_seconds"):
            if getattr(self, key) < 0:
                raise ConfigError(f"{key} must not be negative")
        for key in ("analytics_max_pending", "analytics_stream_files", "analytics_partitions"):
            if getattr(self, key) < 1:
                raise ConfigError(f"{key} must be at least 1")
        if not self.analytics_master.strip():
            raise ConfigError("analytics_master must name a Spark master (local[*] by default)")
        if self.metrics_access not in ("scope", "loopback", "open"):
            raise ConfigError('metrics_access must be "scope", "loopback" or "open"')
        if self.ready_commit_timeout <= 0:
            raise ConfigError("ready_commit_timeout must be positive")

    @property
    def clustered(self) -> bool:
        """Whether several nodes may share this gateway's engine (``engine = "redis"``)."""
        return self.engine == "redis"

    @property
    def lake(self) -> str:
        """Where the mirror writes: ``mirror_lake``, or ``lake`` in the data directory."""
        return self.mirror_lake or str(Path(self.data_dir) / "lake")

    def _check_tracing(self) -> None:
        if not 0.0 <= self.tracing_sample <= 1.0:
            raise ConfigError("tracing_sample must be between 0 and 1")
        if self.otlp_endpoint:
            if not self.tracing:
                raise ConfigError("otlp_endpoint needs tracing = true")
            bad = ConfigError(
                f"otlp_endpoint must be an http:// or https:// URL, not {self.otlp_endpoint!r}"
            )
            try:
                url = urllib.parse.urlsplit(self.otlp_endpoint)
                url.port  # noqa: B018  # raises ValueError for a port that is none
            except ValueError:
                raise bad from None
            if url.scheme not in ("http", "https") or not url.hostname or " " in url.netloc:
                raise bad

    def _check_engine(self) -> None:
        if self.engine not in ("embedded", "redis"):
            raise ConfigError('engine must be "embedded" or "redis"')
        try:
            cluster.seeds(self.redis_url)
        except ValueError as exc:  # the message never repeats the URL: it may hold a password
            raise ConfigError(
                "redis_url must be redis://host:port or rediss://host:port, or several "
                f"separated by commas: {exc}"
            ) from None
        if self.redis_start_wait < 0:
            raise ConfigError("redis_start_wait must not be negative")
        if not _NAMESPACE.fullmatch(self.redis_namespace):
            raise ConfigError("redis_namespace must be 1 to 64 of A-Z a-z 0-9 . _ -")
        if not 1 <= self.workers <= MAX_WORKERS:
            raise ConfigError(f"workers must be from 1 to {MAX_WORKERS}")
        if self.workers > 1 and self.engine != "redis":
            raise ConfigError(
                'workers above 1 need engine = "redis": the embedded engine\'s pipes live '
                "in one process, so a second process would serve other pipes (docs/CLUSTER.md)"
            )
        if self.workers > 1 and self.port == 0:
            raise ConfigError("workers above 1 need a fixed port: with port 0 each picks its own")

    def shared_at(self) -> str:
        """Where the state nodes share is, for a message: the cluster's seed URLs
        without their password for the "redis" engine, "" for the embedded one."""
        return redact(self.redis_url) if self.engine == "redis" else ""

    def engine_config(self) -> EngineConfig:
        return EngineConfig(
            domains=self.domains,
            feeds=self.feeds,
            default_feed_type=self.legacy_default_feed_type,
            max_pipe_messages=self.max_pipe_messages,
            max_pipe_bytes=self.max_pipe_bytes,
            overflow=self.overflow,
            max_feed_queue=self.max_feed_queue,
            max_feed_queue_bytes=self.max_feed_queue_bytes,
            listing_cap=self.listing_cap,
            staged_ttl=self.staged_ttl,
            max_staged_bytes=self.max_staged_bytes,
            max_staged_bytes_per_principal=self.max_staged_bytes_per_principal,
            lease=self.lease,
            max_deliveries=self.max_deliveries,
            dead_letter_feed=self.dead_letter_feed,
            system_feed=self.system_feed,
            system_feed_type=self.system_feed_type,
            events_interval=self.events_interval,
            pipe_idle_timeout=self.pipe_idle_timeout,
            dedup_window=self.dedup_window,
            dedup_max=self.dedup_max,
            memory_budget=self.memory_budget,
            webhooks=WebhookLimits(
                concurrency=self.webhook_concurrency,
                concurrency_limit=self.webhook_concurrency_limit,
                timeout=self.webhook_timeout,
                timeout_limit=self.webhook_timeout_limit,
                max_attempts=self.webhook_max_attempts,
                max_attempts_limit=self.webhook_max_attempts_limit,
                max_age=self.webhook_max_age,
                max_age_limit=self.webhook_max_age_limit,
                backoff_base=self.webhook_backoff_base,
                backoff_cap=self.webhook_backoff_cap,
            ),
        )


_TABLES = {"issuers": IssuerConfig, "clients": Client, "users": User}
_SCALARS = {
    f.name: f
    for f in dataclasses.fields(Config)
    if f.init and f.name not in ("domains", "feeds", "bridges", *_TABLES, "domain_principals")
}


def _coerce(key: str, value: Any, source: str) -> Any:
    kind = _SCALARS[key].type
    try:
        if kind == "bool":
            if isinstance(value, str):
                lowered = value.strip().lower()
                if lowered not in ("1", "0", "true", "false", "yes", "no", "on", "off"):
                    raise ValueError(value)
                return lowered in ("1", "true", "yes", "on")
            return bool(value)
        if kind == "int":
            if isinstance(value, bool):
                raise ValueError(value)
            return int(value)
        if kind == "float":
            return float(value)
        if isinstance(value, list):  # a TOML array of strings (webhook_allow, ...)
            return " ".join(str(item) for item in value)
        return str(value)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{source}: {key} must be a {kind}, not {value!r}") from exc


def load(
    path: str | None = None,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> Config:
    """Build the configuration from its four layers; raises :class:`ConfigError`."""
    values: dict[str, Any] = {}
    if path:
        try:
            data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
        except OSError as exc:
            raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from exc
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"config file {path} is not valid TOML: {exc}") from exc
        values.update(_from_toml(data, path))
    environ = os.environ if env is None else env
    for key in _SCALARS:
        name = f"RESTMS_{key.upper()}"
        if name in environ:
            values[key] = _coerce(key, environ[name], name)
    for key, value in (overrides or {}).items():
        if value is not None:
            values[key] = _coerce(key, value, "command line")
    return Config(**values)


def _from_toml(data: Mapping[str, Any], path: str) -> dict[str, Any]:
    table = dict(data)
    table.update(table.pop("gateway", {}))
    values: dict[str, Any] = {}
    domains = table.pop("domains", None)
    feeds = table.pop("feeds", None)
    bridges = table.pop("bridges", None)
    tables = {key: table.pop(key) for key in _TABLES if key in table}
    for key, value in table.items():
        if key not in _SCALARS:
            raise ConfigError(f"{path}: unknown key {key!r}")
        values[key] = _coerce(key, value, path)
    if domains is not None:
        try:
            values["domains"] = tuple((d["name"], d.get("title", d["name"])) for d in domains)
            values["domain_principals"] = tuple(
                (d["name"], tuple(str(p) for p in d["principals"]))
                for d in domains
                if "principals" in d
            )
        except (KeyError, TypeError, AttributeError) as exc:
            raise ConfigError(f"{path}: each [[domains]] needs a name") from exc
    for key, kind in _TABLES.items():
        entries = tables.get(key)
        if entries is None:
            continue
        try:
            values[key] = tuple(
                kind(**{k: tuple(v) if isinstance(v, list) else v for k, v in e.items()})
                for e in entries
            )
        except (TypeError, ValueError, AttributeError) as exc:
            raise ConfigError(f"{path}: bad [[{key}]] entry: {exc}") from exc
    if feeds is not None:
        try:
            values["feeds"] = tuple(FeedConfig(**f) for f in feeds)
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"{path}: bad [[feeds]] entry: {exc}") from exc
    if bridges is not None:
        try:
            values["bridges"] = tuple(parse_bridge(b) for b in bridges)
        except ValueError as exc:
            raise ConfigError(f"{path}: bad [[bridges]] entry: {exc}") from exc
    return values
