"""A pipe bound to its client: ``pipe = client.bind(pipe)`` then ``pipe.messages()``.

Values stay plain data (a :class:`~restms_client.Pipe` knows no client); a
:class:`BoundPipe` pairs one with the client that reads it, for code that prefers
``for message in pipe.messages():`` to ``client.messages(pipe)``. Its methods are the
client's, so on an asyncio client they are coroutines (and ``messages()`` is for
``async for``).
"""

from __future__ import annotations

from collections.abc import Coroutine, Iterator, Mapping
from typing import TYPE_CHECKING, Any, Generic, TypeVar, overload

from .ops import GapHandler
from .values import Delivery, Feed, Join, Pipe

if TYPE_CHECKING:
    from .client import AsyncClient, AsyncMessages, Client

C = TypeVar("C", "Client", "AsyncClient")


class BoundPipe(Generic[C]):
    """``value`` (the pipe as last fetched) and the client that reads it."""

    def __init__(self, client: C, value: Pipe) -> None:
        self.client: C = client
        self.value = value

    def __repr__(self) -> str:
        return f"BoundPipe({self.value.href})"

    @overload
    def messages(
        self: BoundPipe[Client],
        *,
        auto_ack: bool = ...,
        transport: str = ...,
        on_gap: GapHandler = ...,
    ) -> Iterator[Delivery[None]]: ...
    @overload
    def messages(
        self: BoundPipe[AsyncClient],
        *,
        auto_ack: bool = ...,
        transport: str = ...,
        on_gap: GapHandler = ...,
    ) -> AsyncMessages: ...
    def messages(
        self, *, auto_ack: bool = False, transport: str = "auto", on_gap: GapHandler = None
    ) -> Any:
        """The pipe's messages, as ``client.messages(pipe, ...)``."""
        return self.client.messages(
            self.value, auto_ack=auto_ack, transport=transport, on_gap=on_gap
        )

    @overload
    def join(
        self: BoundPipe[Client],
        feed: Feed | str,
        address: str = ...,
        *,
        type: str | None = ...,
        headers: Mapping[str, str] | None = ...,
    ) -> Join: ...
    @overload
    def join(
        self: BoundPipe[AsyncClient],
        feed: Feed | str,
        address: str = ...,
        *,
        type: str | None = ...,
        headers: Mapping[str, str] | None = ...,
    ) -> Coroutine[Any, Any, Join]: ...
    def join(
        self,
        feed: Feed | str,
        address: str = "*",
        *,
        type: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> Any:
        """Join this pipe to ``feed``, as ``client.join(pipe, ...)``."""
        return self.client.join(self.value, feed, address, type=type, headers=headers)

    @overload
    def delete(self: BoundPipe[Client]) -> None: ...
    @overload
    def delete(self: BoundPipe[AsyncClient]) -> Coroutine[Any, Any, None]: ...
    def delete(self) -> Any:
        """Delete this pipe, as ``client.delete(pipe)``."""
        return self.client.delete(self.value)
