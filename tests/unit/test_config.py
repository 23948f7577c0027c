"""Configuration layering: defaults < TOML file < RESTMS_* environment < command line."""

from __future__ import annotations

from pathlib import Path

import pytest

from auth import User, cluster, is_loopback
from gateway.server.config import Config, ConfigError, load


def test_defaults_listen_on_loopback_8080_with_var_data_dir() -> None:
    config = load(env={})
    assert (config.host, config.port, config.data_dir) == ("127.0.0.1", 8080, "./var")


def test_file_then_env_then_flags_override_in_order(tmp_path: Path) -> None:
    path = tmp_path / "gw.toml"
    path.write_text(
        'port = 9001\nmax_wait = 12.5\ndata_dir = "/tmp/a"\n[gateway]\nmax_body = 100\n'
    )
    config = load(
        str(path),
        env={"RESTMS_PORT": "9002", "RESTMS_MAX_BODY": "200"},
        overrides={"port": 9003, "data_dir": None},
    )
    assert config.port == 9003  # flag beats env beats file
    assert config.max_body == 200  # env beats file
    assert config.max_wait == 12.5  # file beats default
    assert config.data_dir == "/tmp/a"  # a flag left unset does not override


def test_domains_and_configured_feeds_come_from_toml(tmp_path: Path) -> None:
    path = tmp_path / "gw.toml"
    path.write_text(
        '[[domains]]\nname = "default"\n[[domains]]\nname = "eu"\ntitle = "Europe"\n'
        '[[feeds]]\nname = "alerts"\ntype = "topic"\ndomain = "eu"\n'
    )
    config = load(str(path), env={})
    assert config.domains == (("default", "default"), ("eu", "Europe"))
    assert config.feeds[0].name == "alerts"
    assert config.engine_config().feeds[0].type == "topic"


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("prot = 1\n", "unknown key 'prot'"),
        ('port = "x"\n', "port must be a int"),
        ("port = 70000\n", "out of range"),
        ("expired_wait_status = 404\n", "500 or 503"),
        ("max_body = 0\n", "max_body must be positive"),
        ('store = "postgres"\n', 'store must be "sqlite" or "memory"'),
        ('store_sync = "off"\n', 'store_sync must be "full" or "normal"'),
        ("store_busy_timeout = -1\n", "store_busy_timeout must be from 0 to 60 seconds"),
        ("store_busy_timeout = 61\n", "store_busy_timeout must be from 0 to 60 seconds"),
        ("journal_interval = 0\n", "journal_interval must be positive"),
        ("shutdown_grace = 0\n", "shutdown_grace must be positive"),
        ('overflow = "explode"\n', "overflow must be one of"),
        ("max_pipe_bytes = 0\n", "max_pipe_bytes must be positive"),
        ("max_deliveries = 0\n", "max_deliveries must be positive"),
        ("lease = -1\n", "lease must not be negative"),
        ("dedup_window = -1\n", "dedup_window must not be negative"),
        ("pipe_idle_timeout = -5\n", "pipe_idle_timeout must not be negative"),
        ("idempotency_max = 0\n", "idempotency_max must be at least 1"),
        ("account_failure_rate = -1\n", "account_failure_rate must not be negative"),
        ("account_failure_burst = 0\n", "account_failure_burst must be at least 1"),
        ('dead_letter_feed = "a/b"\n', "dead_letter_feed: "),
        ('dead_letter_feed = "default"\n', "cannot be the default feed"),
        ("[[feeds]]\nbogus = 1\n", "bad [[feeds]] entry"),
        ('system_feed = "a b"\n', "system_feed: "),
        ('system_feed = "dead-letter"\n', "system_feed must be a feed of its own"),
        ('system_feed_type = "fanout"\n', 'system_feed_type must be "topic" or "headers"'),
        ("events_interval = 0\n", "events_interval must be positive"),
        ('[[feeds]]\nname = "restms.system"\n', "is the system feed"),
        (
            '[[bridges]]\nname = "in"\ndirection = "in"\nurls = ["amqp://127.0.0.1:1"]\n'
            'feed = "restms.system"\nsource = "/queue/x"\n',
            "publishes into the system feed",
        ),
        ("port = \n", "not valid TOML"),
    ],
)
def test_bad_config_files_say_what_is_wrong(tmp_path: Path, text: str, needle: str) -> None:
    path = tmp_path / "gw.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=needle.replace("[", r"\[").replace("]", r"\]")):
        load(str(path), env={})


def test_env_values_are_type_checked() -> None:
    with pytest.raises(ConfigError, match="RESTMS_INSECURE"):
        load(env={"RESTMS_INSECURE": "maybe"})
    assert load(env={"RESTMS_INSECURE": "yes", "RESTMS_HOST": "0.0.0.0"}).insecure


def test_non_loopback_bind_is_allowed_now_requests_authenticate() -> None:
    assert Config(host="0.0.0.0").host == "0.0.0.0"  # guests are still loopback-only
    assert Config(host="::1").host == "::1"
    with pytest.raises(ConfigError, match="tls_cert and tls_key"):
        Config(tls_cert="cert.pem")


@pytest.mark.parametrize(
    ("host", "expected"),
    [
        ("127.0.0.1", True),
        ("127.8.9.1", True),
        ("::1", True),
        ("[::1]", True),
        ("localhost", True),
        ("0.0.0.0", False),
        ("10.0.0.1", False),
        ("example.org", False),
    ],
)
def test_is_loopback(host: str, expected: bool) -> None:
    assert is_loopback(host) is expected


def test_missing_config_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read config file"):
        load(str(tmp_path / "nope.toml"), env={})


def test_auth_settings_are_checked() -> None:
    with pytest.raises(ConfigError, match="token_ttl"):
        Config(token_ttl=0.5)
    with pytest.raises(ConfigError, match="oauth_issuer"):
        Config(oauth_issuer="gw.example.com")
    with pytest.raises(ConfigError, match="oauth_issuer"):
        Config(oauth_issuer="https://gw.example.com/?x=1")
    hashed = "scrypt$16384$8$1$AAAA$AAAA"
    with pytest.raises(ConfigError, match="loopback guest"):
        Config(users=(User(name="guest", password_hash=hashed, scopes=()),))
    with pytest.raises(ValueError, match=r"main\.py user hash"):
        User(name="legacy", password_hash="plain-text", scopes=())
    with pytest.raises(ValueError, match="user name"):
        User(name="has space", password_hash=hashed, scopes=())


def test_auth_tables_load_from_toml(tmp_path: Path) -> None:
    path = tmp_path / "gateway.toml"
    path.write_text(
        """
[[domains]]
name = "default"
[[domains]]
name = "acme"
principals = ["alice", "svc-*"]

[[issuers]]
issuer = "https://idp.example"
jwks_url = "https://idp.example/jwks"

[[users]]
name = "legacy"
password_hash = "scrypt$16384$8$1$AAAA$AAAA"
scopes = ["restms:read"]
""",
        encoding="utf-8",
    )
    config = load(str(path))
    assert config.domain_principals == (("acme", ("alice", "svc-*")),)
    assert config.issuers[0].principal_prefix == "idp.example/"
    assert config.users[0].scopes == ("restms:read",)
    path.write_text('[[issuers]]\nissuer = "https://idp.example"\n', encoding="utf-8")
    with pytest.raises(ConfigError, match="jwks_url, jwks_file"):
        load(str(path))


def test_the_example_config_file_loads_with_its_documented_defaults() -> None:
    config = load("deploy/gateway.example.toml")
    defaults = Config()
    for key in ("rate_limit", "token_ttl", "header_timeout", "max_connections", "anonymous"):
        assert getattr(config, key) == getattr(defaults, key), key
    assert ("eu", ("eu-*",)) in config.domain_principals


def test_max_attributes_reaches_the_decoders_and_is_at_least_1() -> None:
    assert load(env={"RESTMS_MAX_ATTRIBUTES": "100"}).codec.max_attributes == 100
    assert Config().codec.max_attributes == 64
    with pytest.raises(ConfigError, match="max_attributes must be at least 1"):
        Config(max_attributes=0)


def test_the_engine_is_chosen_by_file_env_and_flag(tmp_path: Path) -> None:
    assert (load(env={}).engine, load(env={}).workers) == ("embedded", 1)
    path = tmp_path / "gw.toml"
    path.write_text('engine = "redis"\nredis_url = "redis://127.0.0.1:7102"\n')
    config = load(str(path), env={"RESTMS_WORKERS": "3"}, overrides={"redis_url": None})
    assert (config.engine, config.redis_url, config.workers) == (
        "redis",
        "redis://127.0.0.1:7102",
        3,
    )
    config = load(env={"RESTMS_ENGINE": "redis"}, overrides={"workers": 2, "engine": None})
    assert (config.engine, config.workers) == ("redis", 2)


@pytest.mark.parametrize(
    ("settings", "needle"),
    [
        ({"engine": "postgres"}, 'engine must be "embedded" or "redis"'),
        ({"workers": 2}, 'workers above 1 need engine = "redis"'),
        ({"engine": "redis", "workers": 0}, "workers must be from 1 to 256"),
        ({"engine": "redis", "workers": 257}, "workers must be from 1 to 256"),
        ({"engine": "redis", "workers": 2, "port": 0}, "need a fixed port"),
        ({"engine": "redis", "redis_url": "http://127.0.0.1:7101"}, "redis_url must be"),
        ({"engine": "redis", "redis_url": "redis://"}, "redis_url must be"),
        ({"engine": "redis", "redis_url": "redis://a:1,"}, "redis_url must be"),
        ({"engine": "redis", "redis_url": "redis://a:1,rediss://b:2"}, "share its scheme"),
        ({"engine": "redis", "redis_url": "redis://a:1,redis://u:p@b:2"}, "and credentials"),
        ({"engine": "redis", "redis_url": "redis://a:1,redis://b:port"}, "redis_url must be"),
        ({"engine": "redis", "redis_start_wait": -1}, "redis_start_wait must not be negative"),
        ({"engine": "redis", "redis_namespace": "a}b"}, "redis_namespace must be"),
        ({"engine": "redis", "redis_namespace": ""}, "redis_namespace must be"),
    ],
)
def test_engine_settings_are_checked(settings: dict[str, object], needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        Config(**settings)  # type: ignore[arg-type]


def test_a_refused_redis_url_never_shows_its_password() -> None:
    with pytest.raises(ConfigError) as refused:
        Config(redis_url="http://user:s3cret-pass@127.0.0.1:7101")
    assert "s3cret-pass" not in str(refused.value)
    assert "s3cret-pass" not in repr(Config(redis_url="redis://:s3cret-pass@127.0.0.1:7101"))


def test_several_seed_nodes_share_the_first_ones_credentials() -> None:
    first = "rediss://user:pw@10.0.0.1:7101"
    url, more = cluster.seeds(f"{first}, rediss://10.0.0.2:7102,rediss://[::1]:7103")
    assert (url, more) == (first, [("10.0.0.2", 7102), ("::1", 7103)])
    assert cluster.seeds("redis://127.0.0.1:7101") == ("redis://127.0.0.1:7101", [])
    assert Config(engine="redis", redis_url=f"{first},rediss://h:1").redis_start_wait == 30.0
    with pytest.raises(ConfigError) as refused:
        Config(redis_url="redis://user:s3cret-pass@a:1,redis://b:x")
    assert "s3cret-pass" not in str(refused.value)
