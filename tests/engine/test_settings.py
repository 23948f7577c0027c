"""The engine's settings (``EngineService.setting``, ``keep_setting``, ``list_settings``,
``drop_setting``): a few durable values of the gateway's own, such as the gateway id
every node of a cluster agrees on (docs/FEDERATION.md) and the run-time bridges every
node runs one of (docs/CLUSTER.md), kept across a restart and refused when their
commit fails."""

from __future__ import annotations

import asyncio
import json
import secrets

import pytest
from blockbuster import BlockBuster

from bridges.config import parse
from bridges.registry import EngineKept
from feeds.config import EngineConfig
from feeds.redis import RedisEngine
from feeds.service import EngineService
from restms.errors import ServiceUnavailable
from tests.nodes import CLUSTER_URL

from .conftest import MakeEngine, forget_namespace, refuse_commits


async def test_a_setting_comes_back_as_kept(engine: EngineService) -> None:
    assert await engine.setting("gateway-id") is None
    assert await engine.keep_setting("gateway-id", "site-a") == "site-a"
    assert await engine.setting("gateway-id") == "site-a"
    assert await engine.keep_setting("gateway-id", "site-b") == "site-b"  # replaced
    assert await engine.setting("gateway-id") == "site-b"
    assert await engine.setting("federation/out/pipe") is None  # names are apart
    url = "http://127.0.0.1:8080/restms/resource/" + "x" * 4000
    assert await engine.keep_setting("federation/out.1:a_b-c/pipe", url) == url
    assert await engine.setting("federation/out.1:a_b-c/pipe") == url
    assert await engine.keep_setting("empty", "") == ""  # held, though empty
    assert await engine.setting("empty") == ""
    assert await engine.keep_setting("empty", "later", only_new=True) == ""


async def test_only_new_keeps_the_first_value_and_answers_it(engine: EngineService) -> None:
    assert await engine.keep_setting("gateway-id", "first", only_new=True) == "first"
    assert await engine.keep_setting("gateway-id", "second", only_new=True) == "first"
    assert await engine.setting("gateway-id") == "first"
    # Many at once (as the nodes of a cluster start together): one value wins for all.
    offers = [f"offer-{n}" for n in range(20)]
    answers = await asyncio.gather(
        *(engine.keep_setting("node-id", offer, only_new=True) for offer in offers)
    )
    assert len(set(answers)) == 1
    assert answers[0] in offers
    assert await engine.setting("node-id") == answers[0]


async def test_settings_are_listed_by_prefix_in_the_order_of_their_names(
    engine: EngineService,
) -> None:
    assert await engine.list_settings("bridge/") == ()
    await engine.keep_setting("bridge/b", "2")
    await engine.keep_setting("bridge/a", "1")
    await engine.keep_setting("bridges", "apart")  # begins with "bridge" but not "bridge/"
    await engine.keep_setting("gateway-id", "site")
    assert await engine.list_settings("bridge/") == (("bridge/a", "1"), ("bridge/b", "2"))
    assert await engine.list_settings("bridge/a") == (("bridge/a", "1"),)
    everything = await engine.list_settings("")
    assert everything == tuple(sorted(everything))
    assert {"bridge/a", "bridge/b", "bridges", "gateway-id"} <= {n for n, _ in everything}
    for prefix in ("a b", "é", "x" * 201):
        with pytest.raises(ValueError, match="prefix"):
            await engine.list_settings(prefix)


async def test_a_dropped_setting_is_gone_and_only_drops_what_it_was_given(
    engine: EngineService,
) -> None:
    assert await engine.drop_setting("bridge/a") is False  # nothing held
    await engine.keep_setting("bridge/a", "first")
    assert await engine.drop_setting("bridge/a", only="other") is False  # compared first
    assert await engine.setting("bridge/a") == "first"
    assert await engine.drop_setting("bridge/a", only="first") is True
    assert await engine.setting("bridge/a") is None
    assert await engine.list_settings("bridge/") == ()
    assert await engine.drop_setting("bridge/a", only="first") is False  # already gone
    await engine.keep_setting("bridge/a", "again")
    assert await engine.drop_setting("bridge/a") is True  # without only: whatever it held
    # Dropped, the name is new again: the next only_new offer wins.
    assert await engine.keep_setting("bridge/a", "later", only_new=True) == "later"
    with pytest.raises(ValueError, match="name"):
        await engine.drop_setting("a b")


async def test_of_drops_racing_on_one_value_one_wins(engine: EngineService) -> None:
    for attempt in range(5):
        name = f"bridge/race-{attempt}"
        await engine.keep_setting(name, "v")
        won = await asyncio.gather(*(engine.drop_setting(name, only="v") for _ in range(10)))
        assert won.count(True) == 1
        assert await engine.setting(name) is None


async def test_settings_survive_a_restart(restart: MakeEngine) -> None:
    """Embedded: the store, reopened on the same directory. Redis: another engine on
    the same namespace, as another node (or the same one started again) is."""
    engine = await restart()
    await engine.keep_setting("gateway-id", "site-a", only_new=True)
    await engine.keep_setting("federation/in/pipe", "http://127.0.0.1:1/restms/resource/p")
    await engine.keep_setting("bridge/gone", "dropped before the restart")
    assert await engine.drop_setting("bridge/gone", only="dropped before the restart")
    engine = await restart(crash=True)  # committed when it returned: no clean close needed
    assert await engine.setting("bridge/gone") is None  # its drop was committed too
    assert await engine.setting("gateway-id") == "site-a"
    assert await engine.keep_setting("gateway-id", "site-b", only_new=True) == "site-a"
    assert await engine.setting("federation/in/pipe") == "http://127.0.0.1:1/restms/resource/p"
    await engine.keep_setting("federation/in/pipe", "http://127.0.0.1:2/restms/resource/q")
    engine = await restart()
    assert await engine.setting("federation/in/pipe") == "http://127.0.0.1:2/restms/resource/q"


@pytest.mark.alone  # the cluster's masters refuse every write meanwhile
async def test_a_setting_whose_commit_fails_is_refused_and_not_kept(restart: MakeEngine) -> None:
    engine = await restart()
    await engine.keep_setting("kept", "before")
    async with refuse_commits(engine):
        with pytest.raises(ServiceUnavailable) as refused:
            await engine.keep_setting("kept", "after")
        assert refused.value.retry_after > 0
        with pytest.raises(ServiceUnavailable):
            await engine.keep_setting("gateway-id", "lost", only_new=True)
        with pytest.raises(ServiceUnavailable):
            await engine.drop_setting("kept", only="before")
    assert await engine.setting("kept") == "before"  # the failed drop put it back
    assert await engine.setting("gateway-id") is None
    assert await engine.keep_setting("gateway-id", "retried", only_new=True) == "retried"
    engine = await restart()
    assert await engine.setting("kept") == "before"
    assert await engine.setting("gateway-id") == "retried"


@pytest.mark.parametrize(
    "name",
    ["", "x" * 201, "gateway id", "a\nb", "é", "a*b", "a\x00b", "日本"],
    ids=["empty", "201-chars", "space", "newline", "accent", "star", "nul", "cjk"],
)
async def test_a_bad_name_is_refused(engine: EngineService, name: str) -> None:
    with pytest.raises(ValueError, match="name"):
        await engine.keep_setting(name, "value")
    with pytest.raises(ValueError, match="name"):
        await engine.setting(name)


async def test_a_name_of_200_characters_and_a_value_of_4096_are_taken(
    engine: EngineService,
) -> None:
    name, value = "n" * 200, "v" * 4096
    assert await engine.keep_setting(name, value) == value
    assert await engine.setting(name) == value
    with pytest.raises(ValueError, match="value"):
        await engine.keep_setting(name, "v" * 4097)
    with pytest.raises(ValueError, match="value"):
        await engine.keep_setting("other", "v" * 4097, only_new=True)
    assert await engine.setting(name) == value  # the refused value changed nothing
    assert await engine.setting("other") is None


async def test_two_nodes_offering_at_once_agree_on_one_value(blockbuster: BlockBuster) -> None:
    """Redis only (the embedded engine is one process per data directory): two gateway
    nodes on one namespace, each offering its own gateway id at the same moment."""
    namespace = f"restms-test-{secrets.token_hex(6)}"
    nodes = [RedisEngine.open(EngineConfig(), CLUSTER_URL, namespace=namespace) for _ in range(2)]
    try:
        for node in nodes:
            await node.start()
        for attempt in range(5):
            name = f"gateway-id-{attempt}"
            answers = await asyncio.gather(
                *(
                    node.keep_setting(name, f"node-{n}", only_new=True)
                    for n, node in enumerate(nodes)
                )
            )
            assert answers[0] == answers[1]
            assert [await node.setting(name) for node in nodes] == answers
            # Each drops the value it read: one of them wins, as one node's delete of
            # a run-time bridge does.
            dropped = await asyncio.gather(
                *(node.drop_setting(name, only=answers[0]) for node in nodes)
            )
            assert sorted(dropped) == [False, True]
            assert [await node.list_settings(name) for node in nodes] == [(), ()]
    finally:
        for node in nodes:
            await node.close()
        await forget_namespace(namespace)


async def test_kept_bridges_are_read_anew_only_when_they_change(
    engine: EngineService, caplog: pytest.LogCaptureFixture
) -> None:
    """The run-time bridges every node reads each second (bridges.registry.EngineKept):
    a definition is parsed once a value; one that is not valid any more is skipped and
    logged once, not at every reading; a changed one is read anew."""
    kept = EngineKept(engine)
    definition = {
        "name": "out",
        "kind": "amqp",
        "direction": "out",
        "urls": ["amqp://127.0.0.1:1"],
        "feed": "orders",
        "target": "/exchange/amq.topic/{address}",
    }
    assert await kept.add(parse(definition))
    await engine.keep_setting("bridge/broken", '{"made": "x", "definition": {"name": 7}}')
    for _ in range(3):
        assert [(n, c.feed) for n, c in (await kept.load()).items()] == [("out", "orders")]
    assert caplog.text.count("run-time bridge bridge/broken is not valid") == 1
    value = json.dumps({"made": "y", "definition": {**definition, "feed": "news"}})
    await engine.keep_setting("bridge/out", value)
    assert (await kept.load())["out"].feed == "news"
    await engine.drop_setting("bridge/broken")
    await engine.keep_setting("bridge/broken", '{"made": "z", "definition": {"name": 7}}')
    assert list(await kept.load()) == ["out"]
    assert caplog.text.count("run-time bridge bridge/broken is not valid") == 2  # came back
