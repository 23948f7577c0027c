"""Staged contents (RestMS M1-M4): opaque bodies POSTed to a feed, kept until a message
references them (M8-M10: a publish claims them) or their time to live ends. Over the
engine's :class:`~feeds.catalogue.Catalogue`; theory of operation in :mod:`feeds.engine`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from collections.abc import Set as AbstractSet

from restms import names
from restms.errors import Forbidden, NotFound, PayloadTooLarge, ServiceUnavailable, TooManyRequests
from restms.specs import EmbeddedContent, LinkedContent, MessageSpec, check_text

from .catalogue import Catalogue
from .mirroring import embedded
from .model import Blob, Feed, Part, Parts, StagedContent, alive, message_size

# Seconds a refused staging is told to wait: staged contents go when a message uses
# them or their time to live ends, so room comes back over time.
RETRY_STAGING = 5


def release(counts: Counter[str], owner: str, amount: int = 1) -> None:
    """Take ``amount`` off what ``owner`` holds; an owner left with nothing is forgotten."""
    left = counts[owner] - amount
    if left > 0:
        counts[owner] = left
    else:
        counts.pop(owner, None)


class Staging:
    """Staged contents: kept, claimed by a publish, expired, given back."""

    def __init__(self, state: Catalogue) -> None:
        self.state = state

    def stage(self, feed: Feed, data: bytes, content_type: str, owner: str) -> StagedContent:
        """M1: keep an opaque body until a message references it, or its TTL ends (M4)."""
        alive(feed)
        check_text(content_type, "content", "type")
        state = self.state
        size = len(data)
        # A principal's own share first: one that keeps its share full is told so (429),
        # and cannot fill the whole budget against the others (503 for everyone).
        share = state.config.max_staged_bytes_per_principal
        if size > share:  # would never fit: waiting does not help
            raise PayloadTooLarge(f"a staged content may hold {share} bytes at most")
        if state.staged_of[owner] + size > share:
            raise TooManyRequests(
                f"staging quota reached: {share} bytes of staged contents per principal; "
                "publish the ones staged or let them expire first",
                RETRY_STAGING,
            )
        if state.staged_bytes + size > state.config.max_staged_bytes:
            raise ServiceUnavailable(
                "too many staged contents are waiting; retry later", RETRY_STAGING
            )
        key = names.new_hash()
        staged = StagedContent(
            key,
            feed,
            Blob(data, content_type),
            owner,
            state.wall(),
            state.mono() + state.config.staged_ttl,
        )
        feed.staged[key] = staged
        state.private[key] = staged
        state.staged_bytes += size
        state.staged_of[owner] += size
        state.counters.staged += 1
        return staged

    def expire_staged(self) -> int:
        """M4: drop staged contents past their TTL; returns how many went."""
        now = self.state.mono()
        expired = [
            s
            for s in self.state.private.values()
            if isinstance(s, StagedContent) and s.expires <= now
        ]
        for staged in expired:
            self.delete_staged(staged)
        self.state.counters.staged_expired += len(expired)
        return len(expired)

    def delete_staged(self, staged: StagedContent) -> None:
        if staged.deleted:
            return
        state = self.state
        staged.deleted = True
        staged.feed.staged.pop(staged.key, None)
        state.private.pop(staged.key, None)
        size = len(staged.blob.data)
        state.staged_bytes -= size
        release(state.staged_of, staged.owner, size)
        staged.wake()

    def unstage(self, staged: StagedContent) -> None:
        """A staged content a withdrawn publish used is there again, until its TTL."""
        state = self.state
        feed = staged.feed
        if feed.deleted or staged.key in state.private:
            return
        staged.deleted = False
        feed.staged[staged.key] = staged
        state.private[staged.key] = staged
        size = len(staged.blob.data)
        state.staged_bytes += size
        state.staged_of[staged.owner] += size

    # ------------------------------------------------------------ claimed by a publish
    def spec_size(self, spec: MessageSpec) -> int:
        """The size a message will have once its staged contents are claimed."""
        total = spec.head_size
        for content in spec.contents:
            if isinstance(content, EmbeddedContent):
                total += len(content.value)
            else:
                staged = self.state.staged_at(content.path)
                total += len(staged.blob.data) if staged is not None else 0
        return total

    def claim(
        self,
        feed: Feed,
        messages: Sequence[MessageSpec],
        skip: AbstractSet[int],
        owner: str | None,
    ) -> tuple[list[tuple[Parts, int]], Sequence[StagedContent]]:
        """M8-M10: check every reference first; only then use the staged contents up.
        Each message's parts and their size in bytes, as pipe limits count them, and
        the staged contents used (then some sizes count more than the message's
        embedded contents; a withdrawn publish gives them back, :meth:`unstage`).

        A message that links no staged content delivers its spec's own contents.
        Repeated messages (``skip``) are not routed, so their references are not used.
        """
        claimed: dict[str, StagedContent] = {}
        out: list[tuple[Parts, int]] = []
        for index, spec in enumerate(messages):
            size = spec.head_size
            for content in spec.contents:
                if type(content) is not EmbeddedContent:
                    break
                size += len(content.value)
            else:  # all embedded (most messages)
                out.append((spec.contents, size))  # type: ignore[arg-type]
                continue
            if skip and index in skip:
                out.append((spec.contents, embedded(spec)))  # type: ignore[arg-type]
                continue
            parts: list[Part | None] = []
            for content in spec.contents:
                if not isinstance(content, LinkedContent):
                    parts.append(content)
                    continue
                staged = self.state.staged_at(content.path)
                if staged is not None and owner is not None and staged.owner != owner:
                    staged = None  # another principal's: not there for this one
                if staged is None or staged.key in claimed:
                    raise NotFound(f"staged content {content.path} does not exist or was used")
                if staged.feed is not feed:
                    raise Forbidden(f"staged content {content.path} belongs to another feed")
                claimed[staged.key] = staged
                parts.append(staged.blob)
            out.append((tuple(parts), message_size(spec, parts)))
        if not claimed:
            return out, ()
        for staged in claimed.values():
            self.delete_staged(staged)
        return out, tuple(claimed.values())
