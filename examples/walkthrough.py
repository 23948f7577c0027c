"""A first tour of the gateway with the Python client library: the twin of walkthrough.sh.

The same eight steps: discover the domain, make a pipe, publish to it through the
default feed, receive and acknowledge, then a topic feed with a join, the same round
trip in the other wire format (XML here, as the library speaks JSON by default), and
clean up. Each step says what it did; the script stops with exit status 1 at the first
step that does not give what it expects.

Start a gateway first (scripts/serve), then, from the repository root:
    .venv/bin/python examples/walkthrough.py
Another gateway:   RESTMS_URL=http://127.0.0.1:18181 .venv/bin/python examples/walkthrough.py
With an access token (docs/AUTH.md), not as the loopback guest:
    RESTMS_TOKEN=<access_token> .venv/bin/python examples/walkthrough.py
The feed walkthrough-news belongs to the principal that made it first; a run as
another principal is refused (403) when it tries to delete it (step 6). Safe to run again.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout as is

from restms_client import Bearer, Client, Message, NotFound, RestMSError

FEED_NAME = "walkthrough-news"


class Failed(Exception):
    """A step that did not give what it should."""


def step(title: str) -> None:
    print(f"\n== {title}")


def expect(condition: bool, what: str) -> None:
    if not condition:
        raise Failed(what)


def tour(client: Client, xml: Client) -> None:
    step("1. Discover the default domain: profiles and public feeds")
    domain = client.domain()
    print(f"domain {domain.href}: profiles {', '.join(domain.profiles)}")
    expect("3/Defaults" in domain.profiles, "the domain lists the 3/Defaults profile")
    default = domain.feed("default")
    print(f"default feed: {default.href}")

    step("2. Create a pipe")
    pipe = client.create_pipe(title="walkthrough")
    print(f"pipe: {pipe.href}")
    print(f"pipe name (its address on the default feed): {pipe.name}")
    print(f"asynclet (where the next message will be): {pipe.asynclet}")

    step("3. Publish to the default feed, addressed to the pipe")
    hello = Message.of(
        "Hello, RestMS", address=pipe.name, message_id=f"hello-{pipe.name}", headers={"lang": "en"}
    )
    published = client.publish(default, hello)
    print(f"published {published.message_ids[0]}: reached {published.counts[0]} pipe")
    expect(published.counts == (1,), "the message reached the pipe")

    step("4. Read the pipe: the message is at the asynclet (a read would wait if it were empty)")
    for message in client.messages(pipe):
        print(f"{message.href}: {message.text!r}, headers {dict(message.headers)}")
        expect(message.text == "Hello, RestMS", "the message carries the published content")

        step("5. Acknowledge it (this also removes every older message)")
        message.ack()
        break
    listing = client.pipe(pipe)
    expect(listing.messages == (), "the pipe holds nothing after the acknowledgement")
    print(f"new asynclet: {listing.asynclet}")

    step("6. A topic feed and a join")
    existing = next((f for f in domain.feeds if f.name == FEED_NAME), None)
    if existing is not None:  # an earlier run stopped half-way
        client.delete(existing)
    feed = client.create_feed(FEED_NAME, "topic", title="Walkthrough news")
    print(f"feed: {feed.href}")
    again = client.create_feed(FEED_NAME, "topic")
    print("Creating a public feed again is idempotent: the same feed.")
    expect(again.href == feed.href, "the second create gives the same feed")
    join = client.join(pipe, feed, "weather.#")
    print(f"join: {join.href} ({join.address})")
    published = client.publish(
        feed,
        [
            Message.of("Rain over Europe", address="weather.eu.rain"),
            Message.of("Not for this pipe", address="sports.football"),
        ],
    )
    print(f"publish counts (one per message): {published.counts}")
    expect(published.counts == (1, 0), "the join takes weather.# only")
    for message in client.messages(pipe, auto_ack=True):
        print(f"{message.address}: {message.text!r}")
        expect(message.text == "Rain over Europe", "the pipe gets the weather")
        message.ack()
        break

    step("7. The same round trip in XML")
    xml_pipe = xml.create_pipe(title="walkthrough-xml")
    print(f"pipe: {xml_pipe.href}")
    xml.publish(default, Message.of("Hello in XML", address=xml_pipe.name))
    for message in xml.messages(xml_pipe):
        print(f"content value: {message.text!r}")
        expect(message.text == "Hello in XML", "the XML message carries the published content")
        message.ack()
        break

    step("8. Clean up: delete the pipes and the feed (a second delete would succeed too)")
    for resource in (xml_pipe, pipe, feed):
        client.delete(resource)
        print(f"deleted {resource.href}")
    try:
        client.pipe(pipe)
    except NotFound:
        print("the pipe is gone: 404")
    else:
        raise Failed("the deleted pipe is still there")


def main() -> int:
    base = os.environ.get("RESTMS_URL", "http://127.0.0.1:8080").rstrip("/")
    token = os.environ.get("RESTMS_TOKEN")
    auth = Bearer(token) if token else None
    if auth:
        print("Every request carries RESTMS_TOKEN as a bearer token.")
    else:
        print("No RESTMS_TOKEN: the requests act as the loopback guest.")
    try:
        with Client(base, auth=auth) as client, Client(base, auth=auth, format="xml") as xml:
            tour(client, xml)
    except (Failed, RestMSError) as exc:
        print(f"\nwalkthrough: FAILED: {exc}", file=sys.stderr)
        return 1
    print(f"\nwalkthrough: all steps passed against {base}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
