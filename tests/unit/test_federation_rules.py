"""The rules a federation link sends by (bridges/federation/trail.py) and what its
definition accepts (bridges/federation/config.py)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bridges.config import parse
from bridges.federation.config import FederationConfig
from bridges.federation.push import outgoing
from bridges.federation.trail import TRAIL, onward, trail, with_origin_id
from feeds.service import Blob, Message, Part
from restms.specs import MESSAGE_PROPERTIES, EmbeddedContent, MessageSpec

REMOTE = "http://127.0.0.1:9/restms/feed/news"


def test_a_local_message_travels_one_hop_and_names_where_it_left() -> None:
    out = onward((("lang", "en"),), own="A", feed="news", remote="B", max_hops=1)
    assert out == (("lang", "en"), (TRAIL, "A/news"))
    assert trail(out) == [("A", "news")]
    # at B, with max_hops 1, it goes no further
    assert onward(out, own="B", feed="news", remote="C", max_hops=1) is None


def test_a_trail_grows_until_max_hops() -> None:
    first = onward((), own="A", feed="news", remote="B", max_hops=3)
    assert first is not None
    second = onward(first, own="B", feed="in/coming", remote="C", max_hops=3)
    assert second is not None
    assert trail(second) == [("A", "news"), ("B", "in/coming")]
    assert dict(second)[TRAIL] == "A/news,B/in%2Fcoming"
    third = onward(second, own="C", feed="news", remote="D", max_hops=3)
    assert third is not None
    assert len(trail(third)) == 3
    assert onward(third, own="D", feed="news", remote="E", max_hops=3) is None


@pytest.mark.parametrize(
    ("own", "remote"),
    [
        ("C", "A"),  # to where it was published
        ("C", "B"),  # to where it passed
        ("B", "D"),  # from a gateway it passed before: it came round a loop
    ],
)
def test_a_message_never_goes_back_where_it_was(own: str, remote: str) -> None:
    been = ((TRAIL, "A/news,B/news"),)
    assert onward(been, own=own, feed="news", remote=remote, max_hops=9) is None
    assert onward(been, own="C", feed="news", remote="D", max_hops=9) is not None


def test_an_unknown_remote_is_stopped_by_its_own_id_and_hops_only() -> None:
    been = ((TRAIL, "A/news"),)
    assert onward(been, own="B", feed="news", remote=None, max_hops=2) is not None
    assert onward(been, own="A", feed="news", remote=None, max_hops=2) is None


def test_an_oversized_trail_is_not_ours_and_not_forwarded() -> None:
    huge = ((TRAIL, ",".join(f"g{i}/news" for i in range(1000))),)
    assert onward(huge, own="Z", feed="news", remote="Y", max_hops=16) is None


def test_the_origin_id_is_given_once_and_kept() -> None:
    props = (("delivery_mode", "2"),)
    named = with_origin_id(props, own="A", feed="a news", stamp="s1")
    assert named == (("message_id", "A/a%20news/s1"), ("delivery_mode", "2"))
    assert with_origin_id(named, own="B", feed="news", stamp="s2") is named
    given = (("message_id", "mine"),)
    assert with_origin_id(given, own="A", feed="news", stamp="s3") is given


_TEXT = st.text(st.characters(codec="utf-8", exclude_categories=("Cs", "Cc")), max_size=8)
_PARTS = st.one_of(
    st.none(),
    st.builds(lambda value: EmbeddedContent(value=value), _TEXT),
    st.builds(lambda data: Blob(data=data, content_type="application/x"), st.binary(max_size=8)),
)


@given(
    address=st.sampled_from(["", "news", "news.eu.fr"]),
    props=st.lists(st.sampled_from(MESSAGE_PROPERTIES), unique=True, max_size=3),
    headers=st.lists(st.tuples(st.sampled_from(["lang", TRAIL, "x"]), _TEXT), max_size=3),
    parts=st.lists(_PARTS, max_size=3),
    max_hops=st.integers(1, 3),
)
def test_what_a_push_link_sends_is_the_message_spec_the_rules_make(
    address: str,
    props: list[str],
    headers: list[tuple[str, str]],
    parts: list[Part],
    max_hops: int,
) -> None:
    """The link builds each message it sends without checking its parts again; built
    the general way, it is the same value, of the same size."""
    spec = MessageSpec(
        address=address, props=tuple((name, f"v-{name}") for name in props), headers=tuple(headers)
    )
    message = Message(
        pipe="p", position=7, spec=spec, parts=tuple(parts), feed="news", arrived=0.0,
        redeliveries=0, size=1, version=0, stamp="s7",
    )  # fmt: skip
    sent = outgoing(message, own="A", feed="news", remote="B", max_hops=max_hops)
    kept = onward(spec.headers, own="A", feed="news", remote="B", max_hops=max_hops)
    if kept is None:
        assert sent is None
        return
    contents = [
        EmbeddedContent.of(part.data, part.content_type) if isinstance(part, Blob) else part
        for part in parts
        if part is not None
    ]
    general = MessageSpec(
        address=address,
        props=with_origin_id(spec.props, own="A", feed="news", stamp="s7"),
        headers=kept,
        contents=tuple(contents),
    )
    assert sent == general
    assert sent is not None
    assert sent.head_size == general.head_size


def test_a_definition_is_parsed_checked_and_shown_without_secrets() -> None:
    config = parse(
        {
            "kind": "federation",
            "name": "to-b",
            "direction": "out",
            "feed": "news",
            "remote": REMOTE,
            "token_url": "http://127.0.0.1:9/oauth/token",
            "client_id": "peer",
            "client_secret": "s3cret",
            "headers": {"lang": "en"},
        }
    )
    assert isinstance(config, FederationConfig)
    assert (config.max_hops, config.batch) == (1, 100)
    assert config.document()["client_secret"] == "***"
    assert "s3cret" not in repr(config)
    assert config.stored()["client_secret"] == "s3cret"
    assert parse(config.stored()) == config


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"remote": "ftp://127.0.0.1/restms/feed/x"}, "http:// or https://"),
        ({"remote": "http://127.0.0.1:9/restms/pipe/x"}, "a feed's URL"),
        ({"remote": "http://u:p@127.0.0.1:9/restms/feed/x"}, "user or password"),
        ({"remote": "http://@127.0.0.1:9/restms/feed/x"}, "user or password"),
        ({"remote": "http:\t//127.0.0.2/restms/feed/x"}, "no spaces or control characters"),
        ({"remote": "http://127.0.0.1:99999/restms/feed/x"}, "not a URL"),
        ({"direction": "both"}, "direction must be out or in"),
        ({"max_hops": 0}, "max_hops must be 1 to 16"),
        ({"batch": 100_001}, "batch must be 1 to 10000"),
        ({"bearer": "t", "client_id": "c"}, "either bearer or client credentials"),
        ({"client_id": "c"}, "need token_url, client_id and client_secret"),
        ({"retry_min": 5, "retry_max": 1}, "retry_min is larger"),
        ({"wait": 0}, "wait must be above 0"),
        ({"max_hops": "2"}, "max_hops must be an integer"),
        ({"colour": "red"}, "unknown federation bridge keys: colour"),
    ],
)
def test_a_bad_definition_says_what_is_wrong(change: dict[str, object], says: str) -> None:
    entry = {"kind": "federation", "name": "x", "direction": "out", "feed": "news"}
    entry["remote"] = REMOTE
    with pytest.raises(ValueError, match=says):
        parse(entry | change)
