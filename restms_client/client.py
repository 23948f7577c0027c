"""The synchronous :class:`Client` and the asyncio :class:`AsyncClient`.

Both have the same methods, made from the same operations (``ops.py``, run as
``steps.py`` describes): a method of :class:`Client` returns the operation's result,
the same method of :class:`AsyncClient` returns a coroutine of it. The method table is
written once (:class:`Operations`); each client only brings its way of doing I/O.
Each client owns one ``httpx2`` session (connection pool, credentials): close it with
``close()`` / ``aclose()``, or use the client as a context manager.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import time
import typing
from collections.abc import AsyncGenerator, Callable, Coroutine, Iterator
from typing import Any, Concatenate, Generic, ParamSpec, Self, TypeVar, overload

import httpx2

from . import admin as admin_ops
from . import codec, ops, patterns, readers, streams
from .auth import ClientCredentials, Credentials, async_session, sync_session
from .bound import BoundPipe
from .errors import ProtocolError, RestMSError, TransportError, Unauthorized
from .steps import Call, Emit, Op, Received, Retry, Sleep, Step
from .values import Delivery, Pipe

P = ParamSpec("P")
T = TypeVar("T")
C = TypeVar("C")

DEFAULT_URL = "http://127.0.0.1:8080"
_OAUTH_ERRORS = {"OAuthError", "InvalidTokenError", "MissingTokenError"}


class _Sync:
    def _call(self, op: Callable[..., Op[T]], *args: Any, **kwargs: Any) -> T:
        raise NotImplementedError


class _Async:
    async def _call(self, op: Callable[..., Op[T]], *args: Any, **kwargs: Any) -> T:
        raise NotImplementedError


class _Method(Generic[P, T]):
    """A client method made from an operation: ``client.x(...)`` runs
    ``ops.x(client's core, ...)``, to its result on a synchronous client and as a
    coroutine on an asyncio one. Read on the class it is a plain function with the
    operation's signature and docstring, which is what documentation tools show."""

    def __init__(self, op: Callable[Concatenate[ops.Core, P], Op[T]]) -> None:
        self.op = op

        def method(self: Any, *args: Any, **kwargs: Any) -> Any:
            return self._call(op, *args, **kwargs)

        self.__signature__ = signature = _signature(op)
        setattr(method, "__signature__", signature)  # noqa: B010 (read by inspect)
        method.__doc__ = op.__doc__
        method.__name__ = op.__name__
        method.__module__ = op.__module__
        self.function = method
        self.__doc__ = op.__doc__  # what documentation tools read on the descriptor

    def __call__(self, client: Any, *args: Any, **kwargs: Any) -> Any:
        """The method called through its class: ``Client.publish(client, ...)``."""
        return self.function(client, *args, **kwargs)

    def __set_name__(self, owner: type, name: str) -> None:
        self.function.__qualname__ = f"{owner.__qualname__}.{name}"

    @overload
    def __get__(self, obj: None, owner: type) -> Callable[..., Any]: ...
    @overload
    def __get__(self, obj: _Sync, owner: type) -> Callable[P, T]: ...
    @overload
    def __get__(self, obj: _Async, owner: type) -> Callable[P, Coroutine[Any, Any, T]]: ...
    def __get__(self, obj: object, owner: type) -> Any:
        if obj is None:
            return self.function
        return functools.partial(obj._call, self.op)  # type: ignore[attr-defined]


def _signature(op: Callable[..., Op[Any]]) -> inspect.Signature:
    """The method's signature: the operation's without its core, returning what the
    operation returns (the generator's return type), its names resolved."""
    hints = typing.get_type_hints(op)
    parameters = [
        p.replace(annotation=hints.get(p.name, p.annotation))
        for p in list(inspect.signature(op).parameters.values())[1:]
    ]
    self_parameter = inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)
    returns = typing.get_args(hints["return"])[2]
    return inspect.Signature([self_parameter, *parameters], return_annotation=returns)


def _step(gen: Op[T], result: Any, error: RestMSError | None) -> Step | StopIteration:
    """Resume ``gen`` with a step's result or error: its next step, or its end."""
    try:
        return gen.send(result) if error is None else gen.throw(error)
    except StopIteration as stop:
        return stop


def _delivery(received: object, ack: Callable[[str], C]) -> Delivery[C]:
    if not isinstance(received, Received):
        raise ProtocolError(f"a reader emitted {received!r}")
    return Delivery(
        message=received.message,
        href=received.href,
        position=received.position,
        delivery_count=received.delivery_count,
        _ack=functools.partial(ack, received.href),
    )


def _request_options(call: Call, oauth: bool) -> dict[str, Any]:
    options: dict[str, Any] = {"headers": call.headers, "content": call.content}
    if call.timeout is not None:
        options["timeout"] = call.timeout
    if oauth and call.anonymous:
        options["withhold_token"] = True
    return options


def _failure(call: Call, exc: Exception) -> RestMSError | None:
    """The library's error for an exception of the HTTP or OAuth layer, if it is one."""
    if isinstance(exc, httpx2.TransportError):
        return TransportError(f"{call.method} {call.url}: {type(exc).__name__}: {exc}")
    if type(exc).__name__ in _OAUTH_ERRORS:  # authlib's: error and description (RFC 6749)
        error = getattr(exc, "error", None) or type(exc).__name__
        description = getattr(exc, "description", None) or str(exc)
        reason = f"token request refused: {error}: {description}"
        return Unauthorized(401, reason, url=call.url, method=call.method)
    return None


class Operations:
    """What both clients can do: the method table, written once (the base of
    :class:`Client` and :class:`AsyncClient`; use those)."""

    def __init__(
        self,
        url: str = DEFAULT_URL,
        *,
        auth: Credentials | None = None,
        format: str = "json",
        retry: Retry | None = None,
        timeout: float = 30.0,
        max_wait: float = 330.0,
        verify: Any = True,
    ) -> None:
        media_type = {"json": codec.JSON, "xml": codec.XML}.get(format)
        if media_type is None:
            raise ValueError("format is 'json' or 'xml'")
        self._core = ops.Core(
            url=url, media_type=media_type, retry=retry or Retry(), max_wait=max_wait
        )
        self._oauth = auth if isinstance(auth, ClientCredentials) else None
        self._open(auth, timeout=timeout, verify=verify, follow_redirects=False)

    def _open(self, auth: Credentials | None, **options: Any) -> None:
        raise NotImplementedError

    domain = _Method(ops.domain)
    create_feed = _Method(ops.create_feed)
    feed = _Method(ops.feed)
    create_pipe = _Method(ops.create_pipe)
    pipe = _Method(ops.pipe)
    join = _Method(ops.join)
    delete = _Method(ops.delete)
    publish = _Method(ops.publish)
    stage = _Method(ops.stage)
    content = _Method(ops.content)
    ack = _Method(ops.ack)
    request = _Method(patterns.request)
    reply = _Method(patterns.reply)
    worker = _Method(patterns.worker)
    subscribe = _Method(patterns.subscribe)
    _token_endpoint = _Method(ops.token_endpoint)


class Client(Operations, _Sync):
    """A synchronous RestMS client.

    ``url`` is the gateway's base URL; ``auth`` a :class:`~restms_client.Bearer`,
    :class:`~restms_client.Basic` or :class:`~restms_client.ClientCredentials` (none:
    the loopback guest); ``format`` ``"json"`` (default) or ``"xml"`` on the wire;
    ``retry`` the :class:`~restms_client.Retry` policy of every request; ``timeout``
    seconds for a request, ``max_wait`` for a wait on an asynclet; ``verify`` as in
    httpx2 (an ``ssl.SSLContext``, or ``False``).
    """

    def _open(self, auth: Credentials | None, **options: Any) -> None:
        self._http = sync_session(auth, **options)
        self.admin = Admin(self)

    def close(self) -> None:
        self._http.close()

    def bind(self, pipe: Pipe) -> BoundPipe[Client]:
        """``pipe`` with this client: ``for message in client.bind(pipe).messages():``."""
        return BoundPipe(self, pipe)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def messages(
        self,
        pipe: Pipe | str,
        *,
        auto_ack: bool = False,
        transport: str = "auto",
        on_gap: ops.GapHandler = None,
    ) -> Iterator[Delivery[None]]:
        """The pipe's messages, oldest first, for ever: ``for m in client.messages(p)``.

        ``transport``: ``"poll"`` (asynclets), ``"sse"`` or ``"websocket"``; ``"auto"``
        is ``"poll"``, which needs nothing but plain requests. Each message is a
        :class:`~restms_client.Delivery`: call its ``ack()``, or pass ``auto_ack=True``
        to acknowledge each one when the loop asks for the next (after its handler
        ran). A gap (messages gone unacknowledged) raises
        :class:`~restms_client.GapError` unless ``on_gap`` takes it. Across a gateway
        restart the reader retries and goes on where it was; a new reader starts with
        the oldest message held, the one after the last acknowledged.
        """
        op = readers.reader(self._core, pipe, transport, auto_ack=auto_ack, on_gap=on_gap)
        for received in self._drive(op, []):
            yield _delivery(received, self.ack)

    def _call(self, op: Callable[..., Op[T]], *args: Any, **kwargs: Any) -> T:
        box: list[T] = []
        for emitted in self._drive(op(self._core, *args, **kwargs), box):
            raise ProtocolError(f"an operation emitted {emitted!r}")
        return box[0]

    def _drive(self, gen: Op[T], box: list[T]) -> Iterator[object]:
        """Run ``gen``'s steps; yield what it emits; put its result in ``box``."""
        result: Any = None
        error: RestMSError | None = None
        with contextlib.ExitStack() as opened, contextlib.closing(gen):
            while not isinstance(step := _step(gen, result, error), StopIteration):
                result, error = None, None
                if isinstance(step, Emit):
                    try:
                        yield step.value
                    except GeneratorExit:
                        return  # the reader is left: close what it opened, cleanly
                    continue
                try:
                    result = self._do(step, opened)
                except RestMSError as exc:
                    error = exc
            box.append(step.value)

    def _do(self, step: Step, opened: contextlib.ExitStack) -> Any:
        if isinstance(step, Call):
            return self._send(step)
        if isinstance(step, Sleep):
            time.sleep(step.seconds)
            return None
        return streams.sync_step(self._http, step, opened)

    def _send(self, call: Call) -> httpx2.Response:
        try:
            if self._oauth is not None and not call.anonymous and not self._http.token:  # type: ignore[attr-defined]
                url = self._oauth.token_url or self._token_endpoint()
                self._http.metadata["token_endpoint"] = url  # type: ignore[attr-defined]
                self._http.fetch_token(url)  # type: ignore[attr-defined]
            return self._http.request(
                call.method, call.url, **_request_options(call, self._oauth is not None)
            )
        except Exception as exc:
            if (failure := _failure(call, exc)) is None:
                raise
            raise failure from exc


class AsyncClient(Operations, _Async):
    """The asyncio client: the methods of :class:`Client` as coroutines, and
    ``async for message in client.messages(pipe)`` (``await message.ack()``)."""

    def _open(self, auth: Credentials | None, **options: Any) -> None:
        self._http = async_session(auth, **options)
        self.admin = AsyncAdmin(self)

    async def aclose(self) -> None:
        await self._http.aclose()

    def bind(self, pipe: Pipe) -> BoundPipe[AsyncClient]:
        """``pipe`` with this client: ``async for message in client.bind(pipe).messages():``."""
        return BoundPipe(self, pipe)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def messages(
        self,
        pipe: Pipe | str,
        *,
        auto_ack: bool = False,
        transport: str = "auto",
        on_gap: ops.GapHandler = None,
    ) -> AsyncMessages:
        """As :meth:`Client.messages`: ``async for message in client.messages(pipe)``.

        Leave the loop inside ``async with client.messages(pipe) as messages:`` (or
        call ``aclose()``): an abandoned asynchronous generator is closed later by the
        event loop, in another task, which a WebSocket's task group does not allow.
        """
        op = readers.reader(self._core, pipe, transport, auto_ack=auto_ack, on_gap=on_gap)
        return AsyncMessages(self._deliveries(op))

    async def _deliveries(self, op: Op[None]) -> AsyncGenerator[AsyncDelivery]:
        # closed here, in this task, not left to the loop's finalizer (see above)
        async with contextlib.aclosing(self._drive(op, [])) as driven:
            async for received in driven:
                yield _delivery(received, self.ack)

    async def _call(self, op: Callable[..., Op[T]], *args: Any, **kwargs: Any) -> T:
        box: list[T] = []
        async for emitted in self._drive(op(self._core, *args, **kwargs), box):
            raise ProtocolError(f"an operation emitted {emitted!r}")
        return box[0]

    async def _drive(self, gen: Op[T], box: list[T]) -> AsyncGenerator[object]:
        result: Any = None
        error: RestMSError | None = None
        async with contextlib.AsyncExitStack() as opened:
            opened.callback(gen.close)
            while not isinstance(step := _step(gen, result, error), StopIteration):
                result, error = None, None
                if isinstance(step, Emit):
                    try:
                        yield step.value
                    except GeneratorExit:
                        return  # the reader is left: close what it opened, cleanly
                    continue
                try:
                    result = await self._do(step, opened)
                except RestMSError as exc:
                    error = exc
            box.append(step.value)

    async def _do(self, step: Step, opened: contextlib.AsyncExitStack) -> Any:
        if isinstance(step, Call):
            return await self._send(step)
        if isinstance(step, Sleep):
            await asyncio.sleep(step.seconds)
            return None
        return await streams.async_step(self._http, step, opened)

    async def _send(self, call: Call) -> httpx2.Response:
        try:
            if self._oauth is not None and not call.anonymous and not self._http.token:  # type: ignore[attr-defined]
                url = self._oauth.token_url or await self._token_endpoint()
                self._http.metadata["token_endpoint"] = url  # type: ignore[attr-defined]
                await self._http.fetch_token(url)  # type: ignore[attr-defined]
            return await self._http.request(
                call.method, call.url, **_request_options(call, self._oauth is not None)
            )
        except Exception as exc:
            if (failure := _failure(call, exc)) is None:
                raise
            raise failure from exc


AsyncDelivery = Delivery[Coroutine[Any, Any, None]]


class AsyncMessages:
    """The messages of a pipe for ``async for``, and an async context manager that
    closes the reader (its stream or socket) where it was opened."""

    def __init__(self, deliveries: AsyncGenerator[AsyncDelivery]) -> None:
        self._deliveries = deliveries

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> AsyncDelivery:
        return await anext(self._deliveries)

    async def aclose(self) -> None:
        await self._deliveries.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


class AdminOperations:
    """The ``/admin`` resources (docs/ADMIN.md): ``client.admin.pipes()`` and so on."""

    bridges = _Method(admin_ops.bridges)
    bridge = _Method(admin_ops.bridge)
    add_bridge = _Method(admin_ops.add_bridge)
    delete_bridge = _Method(admin_ops.delete_bridge)
    pipes = _Method(admin_ops.pipes)
    inspect_pipe = _Method(admin_ops.inspect_pipe)
    purge_pipe = _Method(admin_ops.purge_pipe)
    delete_pipe = _Method(admin_ops.delete_pipe)
    create_pipe = _Method(admin_ops.create_pipe)
    clients = _Method(admin_ops.clients)
    add_client = _Method(admin_ops.add_client)
    revoke_client = _Method(admin_ops.revoke_client)
    stats = _Method(admin_ops.stats)


class Admin(AdminOperations, _Sync):
    """``client.admin`` of a :class:`Client`."""

    def __init__(self, client: Client) -> None:
        self._call = client._call  # type: ignore[method-assign]


class AsyncAdmin(AdminOperations, _Async):
    """``client.admin`` of an :class:`AsyncClient` (coroutines)."""

    def __init__(self, client: AsyncClient) -> None:
        self._call = client._call  # type: ignore[method-assign]
