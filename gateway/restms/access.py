"""Access control: may this principal use this resource this way (docs/AUTH.md)?

Three questions, in this order, for every resource a request names:

1. **Is it there for you?** A domain the principal is not granted (tenants), and
   anything in it, is 404. So is a pipe (with its joins, messages and contents), a
   private feed or a staged content that another principal created: other principals
   cannot tell it from one that never existed (digest Q7).
2. **Do your scopes allow the action?** ``read`` for GETs of domains and feeds,
   ``publish`` to post to a feed (and to create or change one), ``subscribe`` for
   pipes, joins and messages; ``admin`` allows everything. A missing scope is 403
   with an ``insufficient_scope`` challenge naming the scope to ask for.
3. **Is it yours to change?** A public feed may be changed or deleted only by its
   creator or an admin for it (403 for anyone else, Q7).

The system feed (management events, docs/EVENTS.md) is the gateway's: anyone may read
it and join it with ``read`` on it (and ``subscribe`` for the pipe), nobody may
publish to it, stage content on it, change it or delete it (403, admins included).
"""

from __future__ import annotations

from aiohttp import web

from auth import Principal
from feeds.service import (
    HIDDEN,
    ContentRef,
    DomainInfo,
    FeedInfo,
    JoinInfo,
    PipeInfo,
    Slot,
    StagedInfo,
)
from gateway.admin import bridging
from gateway.auth.authn import PRINCIPAL
from gateway.server.state import STATE, State
from restms import specs
from restms.errors import BadRequest, Conflict, Forbidden, InsufficientScope, NotFound

READS = frozenset(("GET", "HEAD"))
SYSTEM_ONLY = (
    "feed {name!r} is the gateway's system feed: its events are published by the "
    "gateway alone; join it to read them (docs/EVENTS.md)"
)


def _not_system(feed: FeedInfo) -> None:
    """403 for any change to the system feed (a publish, a staged content, PUT, DELETE)."""
    if feed.system:
        raise Forbidden(SYSTEM_ONLY.format(name=feed.key))


def _need(principal: Principal, action: str, domain: str, feed: str | None) -> None:
    if not principal.grants.allows(action, domain, feed):
        where = f"feed {feed!r}" if feed is not None else f"domain {domain!r}"
        raise InsufficientScope(
            f"this needs the restms:{action} scope for {where}", f"restms:{action}"
        )


def _feed_visible(state: State, principal: Principal, feed: FeedInfo) -> None:
    """404 unless the principal may know the feed exists."""
    if feed.default:
        return  # F14: the default feed is in every domain; its joins decide delivery
    if feed.name is None and feed.owner != principal.name:  # private: its owner's
        raise NotFound(HIDDEN)
    if not state.auth.tenants.sees(principal, feed.domain):
        raise NotFound(f"no feed named {feed.key!r}") if feed.name is not None else NotFound(HIDDEN)


def admin_deletes(principal: Principal, target: object) -> bool:
    """Whether a DELETE of a pipe the principal cannot see (another's) deletes it: an
    admin of its domain may clean up any pipe, and is never answered a 200 that did
    nothing. A bridge's own pipe is refused (409): it goes with its bridge."""
    if not isinstance(target, PipeInfo) or not principal.grants.allows("admin", target.domain):
        return False
    bridging.keep_bridge_pipe(target.owner)
    return True


def hidden(request: web.Request, target: object) -> bool:
    """True when ``target`` must look absent to this request's principal (step 1)."""
    try:
        visible(request[STATE], request[PRINCIPAL], target)
    except NotFound:
        return True
    return False


# visible() and check() run on every request to a resource: they take what they need
# of the request (its app's state, its principal, its method) from the caller, which
# has them in hand, since each read from the request is a Python-level call in aiohttp.
def visible(state: State, principal: Principal, target: object) -> None:
    """Step 1: 404, with the reply an absent resource of that kind gets, unless
    ``principal`` may know ``target`` exists. What another principal owns the engine
    service hides itself (it is asked as the principal); tenants are the gateway's."""
    if isinstance(target, FeedInfo):  # first: publishes are most of the traffic
        _feed_visible(state, principal, target)
    elif isinstance(target, DomainInfo):
        if not state.auth.tenants.sees(principal, target.name):
            raise NotFound(f"no domain named {target.name!r}")
    elif isinstance(target, PipeInfo | StagedInfo) and target.owner != principal.name:
        raise NotFound(HIDDEN)


def check(principal: Principal, method: str, target: object) -> None:
    """Steps 2 and 3 for ``method`` on ``target`` (403), once :func:`visible` has passed."""
    if isinstance(target, FeedInfo):  # first: publishes are most of the traffic
        domain = target.domain
        if method in READS:
            _need(principal, "read", domain, target.name)
            return
        _not_system(target)
        if method == "POST":  # as may_publish, with the principal in hand
            _need(principal, "publish", domain, target.name)
        elif method in ("PUT", "DELETE"):
            _need(principal, "publish", domain, target.name)
            if target.configured:  # for everyone, admins included: say so to everyone
                raise Forbidden("configured feeds cannot be changed")
            if target.owner != principal.name and not principal.grants.allows(
                "admin", domain, target.name
            ):
                raise Forbidden("only the feed's creator or an admin may change or delete it")
    elif isinstance(target, DomainInfo):
        if method in READS:
            _need(principal, "read", target.name, None)
        # POST: what it creates decides (see :func:`may_create`)
    elif isinstance(target, PipeInfo | JoinInfo | Slot | ContentRef):
        _need(principal, "subscribe", target.domain, None)
    elif isinstance(target, StagedInfo):
        _need(principal, "publish", target.domain, target.feed if target.feed_public else None)


def may_publish(request: web.Request, feed: FeedInfo) -> None:
    """Publishing to a visible feed (a POST, or a WebSocket publish frame) needs
    ``publish`` on it; never to the system feed."""
    _not_system(feed)
    _need(request[PRINCIPAL], "publish", feed.domain, feed.name)


async def may_create(
    request: web.Request, domain: DomainInfo, spec: specs.FeedSpec | specs.PipeSpec
) -> None:
    """A POST to a domain: ``publish`` and the feed cap for a feed, ``subscribe`` and the
    pipe cap for a pipe."""
    principal, state = request[PRINCIPAL], request[STATE]
    service = state.service
    if isinstance(spec, specs.PipeSpec):
        _need(principal, "subscribe", domain.name, None)
        cap = state.config.max_pipes_per_principal
        if (await service.owned(principal.name)).pipes >= cap:
            raise Forbidden(f"pipe quota reached: {cap} pipes per principal; delete one first")
        return
    existing = await _public_feed(request, spec.name)
    if existing is not None and (hidden(request, existing) or existing.domain != domain.name):
        # Q5: public names are unique across the server, so this much is unavoidable
        raise Conflict(f"the feed name {spec.name!r} is taken in another domain")
    _need(principal, "publish", domain.name, spec.name)
    if existing is None:  # C3: asking again for an existing public feed creates nothing
        cap = state.config.max_feeds_per_principal
        if (await service.owned(principal.name)).feeds >= cap:
            raise Forbidden(f"feed quota reached: {cap} feeds per principal; delete one first")


async def _public_feed(request: web.Request, name: str | None) -> FeedInfo | None:
    """The public feed named ``name``, or None."""
    if name is None:
        return None
    try:
        found = await request[STATE].service.feed(None, name)
    except NotFound:
        return None
    return found if found.name is not None else None


async def may_join(request: web.Request, pipe: PipeInfo, path: str) -> None:
    """A join needs the feed to be visible and ``subscribe`` on it (``read`` on the
    system feed, whose events are read, not subscribed to), within the join cap."""
    principal, state = request[PRINCIPAL], request[STATE]
    service = state.service
    feed = await service.feed_at(principal.name, path)  # 400 when there is none (G14)
    if hidden(request, feed):
        raise BadRequest(f"join names no existing feed: {path}")  # as if there were none
    domain = feed.domain if not feed.default else pipe.domain
    _need(principal, "read" if feed.system else "subscribe", domain, feed.name)
    cap = state.config.max_joins_per_principal
    if (await service.owned(principal.name)).joins >= cap:
        raise Forbidden(f"join quota reached: {cap} joins per principal; delete one first")


def readable(request: web.Request, domain: DomainInfo, feed: FeedInfo) -> bool:
    """Whether the listing of ``domain`` shows this public feed to the principal."""
    principal = request[PRINCIPAL]
    return principal.grants.allows("read", domain.name, feed.name)
