"""A Python client for RestMS gateways: ``import restms_client``.

::

    from restms_client import Client, Message

    with Client("http://127.0.0.1:8080") as client:
        feed = client.create_feed("orders", "fanout")
        pipe = client.create_pipe(title="work")
        client.join(pipe, feed, "*")
        client.publish(feed, Message.of("one crate", address="orders.eu"))
        for message in client.messages(pipe):
            print(message.text)
            message.ack()
            break

:class:`AsyncClient` has the same methods as coroutines (``async for`` over
``messages``). The resources are immutable values (:class:`Feed`, :class:`Pipe`,
:class:`Join`, :class:`Message`, :class:`Content`, :class:`Domain`); errors are one
tree rooted in :class:`RestMSError`. docs/CLIENT.md is the guide.
"""

from .auth import Basic, Bearer, ClientCredentials, Credentials
from .bound import BoundPipe
from .client import (
    Admin,
    AdminOperations,
    AsyncAdmin,
    AsyncClient,
    AsyncMessages,
    Client,
    Operations,
)
from .errors import (
    BadRequest,
    Conflict,
    Forbidden,
    GapError,
    NotAcceptable,
    NotFound,
    PayloadTooLarge,
    PreconditionFailed,
    ProtocolError,
    RestMSError,
    ServerError,
    ServiceUnavailable,
    StatusError,
    TooManyRequests,
    TransportError,
    Unauthorized,
    UnprocessableContent,
    UnsupportedMediaType,
)
from .steps import Retry
from .values import Content, Delivery, Domain, Feed, Gap, Join, Listed, Message, Pipe, Published
from .webhooks import Receiver, Refuse, Webhook, aiohttp_handler, asgi_app, signature_ok, wsgi_app

__version__ = "0.1.0"

__all__ = [
    "Admin",
    "AdminOperations",
    "AsyncAdmin",
    "AsyncClient",
    "AsyncMessages",
    "BadRequest",
    "Basic",
    "Bearer",
    "BoundPipe",
    "Client",
    "ClientCredentials",
    "Conflict",
    "Content",
    "Credentials",
    "Delivery",
    "Domain",
    "Feed",
    "Forbidden",
    "Gap",
    "GapError",
    "Join",
    "Listed",
    "Message",
    "NotAcceptable",
    "NotFound",
    "Operations",
    "PayloadTooLarge",
    "Pipe",
    "PreconditionFailed",
    "ProtocolError",
    "Published",
    "Receiver",
    "Refuse",
    "RestMSError",
    "Retry",
    "ServerError",
    "ServiceUnavailable",
    "StatusError",
    "TooManyRequests",
    "TransportError",
    "Unauthorized",
    "UnprocessableContent",
    "UnsupportedMediaType",
    "Webhook",
    "aiohttp_handler",
    "asgi_app",
    "signature_ok",
    "wsgi_app",
]
