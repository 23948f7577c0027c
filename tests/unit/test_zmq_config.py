"""ZeroMQ bridge definitions: what is taken, what is refused and why (docs/ZEROMQ.md)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import zmq

from bridges.config import ZmqBridgeConfig, parse
from gateway.server.config import ConfigError, load

PUBLIC, SECRET = (key.decode() for key in zmq.curve_keypair())


def zmq_def(**changes: Any) -> dict[str, Any]:
    return {"kind": "zeromq", "name": "z", "socket": "push", "feed": "work",
            "endpoints": ["tcp://127.0.0.1:5557"], **changes}  # fmt: skip


def test_defaults_and_direction_follow_the_socket() -> None:
    config = parse(zmq_def())
    assert isinstance(config, ZmqBridgeConfig)
    assert (config.bind, config.at_hwm, config.window, config.linger) == (True, "block", 256, 1.0)
    assert (config.sndhwm, config.rcvhwm, config.timeout) == (1000, 1000, 30.0)
    assert config.durable is False  # the internal pipe stores persistent messages only
    assert parse(zmq_def(durable=True)).durable is True
    directions = {s: parse(zmq_def(socket=s)).direction for s in
                  ("pub", "push", "dealer", "sub", "pull", "router")}  # fmt: skip
    assert directions == {"pub": "out", "push": "out", "dealer": "out",
                          "sub": "in", "pull": "in", "router": "in"}  # fmt: skip


@pytest.mark.parametrize(
    "endpoint",
    ["tcp://127.0.0.1:5557", "tcp://*:5557", "tcp://127.0.0.1:*", "tcp://[::1]:5557",
     "ipc:///tmp/gw.sock", "inproc://work", "tcp://gateway.example:1"],
)  # fmt: skip
def test_bind_endpoints_taken(endpoint: str) -> None:
    assert parse(zmq_def(endpoints=[endpoint])).endpoints == (endpoint,)


BAD: list[tuple[dict[str, Any], str]] = [
    (zmq_def(socket="pair"), "socket must be one of pub, push, dealer, sub, pull, router"),
    (zmq_def(endpoints=[]), "endpoints must name at least one endpoint"),
    (zmq_def(endpoints="tcp://127.0.0.1:1"), ""),  # a single string is taken as a list
    (zmq_def(endpoints=[5]), "endpoints must be a list of strings"),
    (zmq_def(endpoints=["udp://127.0.0.1:1"]), "is not a tcp://, ipc:// or inproc:// endpoint"),
    (zmq_def(endpoints=["pgm://eth0;239.1.1.1:5555"]), "is not a tcp://"),
    (zmq_def(endpoints=["tcp://127.0.0.1"]), "must be tcp://HOST:PORT"),
    (zmq_def(endpoints=["tcp://127.0.0.1:70000"]), "has a bad port"),
    (zmq_def(endpoints=["tcp://127.0.0.1:*"], bind=False), "a connect endpoint needs a host"),
    (zmq_def(endpoints=["tcp://*:1"], bind=False), "a connect endpoint needs a host"),
    (zmq_def(at_hwm="explode"), "at_hwm must be block or drop"),
    (zmq_def(backpressure="maybe"), "backpressure must be wait or skip"),
    (zmq_def(window=0), "window must be 1 to 1000000"),
    (zmq_def(sndhwm=-1), "sndhwm must be 1 to 1000000"),
    (zmq_def(timeout=0), "timeout must be above 0"),
    (zmq_def(timeout=4000), "timeout must be above 0 and at most 3600"),
    (zmq_def(linger=-1), "linger must be 0 to 3600"),
    (zmq_def(max_message_size=-1), "max_message_size must be 0 to 2^53"),
    (zmq_def(subscribe=["eu."]), "subscribe is for sub sockets only"),
    (zmq_def(socket="sub", subscribe=["a" * 2000]), "subscription prefix longer than"),
    (zmq_def(address="a" * 2000), "join address longer than"),
    (zmq_def(curve_secret_key="short"), "curve_secret_key must be a 40-character Z85 key"),
    (zmq_def(curve_server_key=PUBLIC), "CURVE needs the bridge's curve_secret_key"),
    (zmq_def(curve_clients=["x" * 40 + "y"]), "curve_clients must be 40-character Z85 keys"),
    (zmq_def(curve_secret_key=SECRET, curve_server_key=PUBLIC, curve_clients=[PUBLIC]),
     "curve_clients is for a CURVE server"),
    (zmq_def(urls=["amqp://h"]), "unknown zeromq bridge keys: urls"),
    (zmq_def(window="many"), "window must be an integer"),
    (zmq_def(bind="yes"), "bind must be true or false"),
    (zmq_def(durable=1), "durable must be true or false"),
    ({"kind": "zeromq", "name": "z"}, "a zeromq bridge needs socket, endpoints, feed"),
    (zmq_def(kind=["zeromq"]), "unknown bridge kind"),
    (zmq_def(name="no spaces"), "bridge name 'no spaces' must be"),
]  # fmt: skip


@pytest.mark.parametrize(("definition", "needle"), BAD)
def test_bad_definitions_say_why(definition: dict[str, Any], needle: str) -> None:
    if not needle:
        parse(definition)
        return
    with pytest.raises(ValueError, match=re.escape(needle)):
        parse(definition)


def test_the_secret_key_is_hidden_from_the_document_but_stored() -> None:
    config = parse(zmq_def(curve_secret_key=SECRET, curve_clients=[PUBLIC]))
    assert isinstance(config, ZmqBridgeConfig)
    assert config.document()["curve_secret_key"] == "***"
    assert SECRET not in repr(config)
    stored = config.stored()
    assert stored["curve_secret_key"] == SECRET
    assert parse(stored) == config  # what bridges.json keeps comes back the same


def test_zeromq_bridges_load_from_toml(tmp_path: Path) -> None:
    path = tmp_path / "gateway.toml"
    path.write_text(
        '[[bridges]]\nkind = "zeromq"\nname = "fan"\nsocket = "push"\nfeed = "work"\n'
        'endpoints = ["tcp://0.0.0.0:5557"]\nat_hwm = "drop"\n'
        '[[bridges]]\nkind = "zeromq"\nname = "listen"\nsocket = "sub"\nfeed = "in"\n'
        'endpoints = ["tcp://pub.example:5556"]\nbind = false\nsubscribe = ["eu.", "us."]\n'
    )
    fan, listen = load(str(path)).bridges
    assert isinstance(fan, ZmqBridgeConfig)
    assert isinstance(listen, ZmqBridgeConfig)
    assert (fan.socket, fan.at_hwm, listen.subscribe) == ("push", "drop", ("eu.", "us."))
    path.write_text('[[bridges]]\nkind = "zeromq"\nname = "x"\nsocket = "pair"\n'
                    'feed = "f"\nendpoints = ["inproc://x"]\n')  # fmt: skip
    with pytest.raises(ConfigError, match=r"bad \[\[bridges\]\] entry: .*socket must be one of"):
        load(str(path))
