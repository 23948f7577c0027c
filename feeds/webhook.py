"""The delivery state of a webhook pipe: a state machine as data, and what it persists.

A webhook pipe (docs/WEBHOOKS.md) is read by the gateway itself, which POSTs each
message to the pipe's callback. The gateway's worker (``gateway/webhooks/delivery.py``) does
the HTTP; this module holds the state it reports, so that the engine can show it in
the pipe document and keep it in the store across restarts.

Subscription states (one table, STYLE 2)::

    verifying ──verified──> active ──failed──> retrying ──┐
        │                     ^                   │  ^    │ failed
        │ refused             └─────settled───────┘  └────┘
        v
      failed                active, retrying ──gone──> ended

    every state ──changed──> verifying

* **verifying**: nothing is delivered until the receiver has answered the
  verification GET with its challenge (``verified``); any other answer is ``refused``.
* **active**: messages are delivered; **retrying**: at least one message waits for
  its next attempt after a failed one (``failed``). When none waits any more, because
  each was delivered or given up and dead-lettered, the pipe is ``settled`` again.
* **ended**: the receiver answered ``410 Gone``: nothing more is delivered; messages
  stay in the pipe. **failed**: the verification was refused.
* ``changed``: the pipe's callback was changed (or set again on a failed or ended
  pipe) by a PUT: the new receiver is verified before anything is delivered.

Per message, the pipe remembers the attempts made so far and when the next one is
due (only for messages that failed at least once: at most ``concurrency`` of them),
so attempt numbers carry on after a restart. An attempt under way when the gateway
stopped is made again under the same number: its outcome was never known.
"""

from __future__ import annotations

from typing import Any, Protocol

from restms.errors import BadRequest
from restms.webhook import WebhookLimits, WebhookOptions

from .values import WebhookProgress, WebhookState

# state -> event -> the state it leads to
TRANSITIONS: dict[str, dict[str, str]] = {
    "verifying": {"verified": "active", "refused": "failed", "changed": "verifying"},
    "active": {"failed": "retrying", "gone": "ended", "changed": "verifying"},
    "retrying": {
        "failed": "retrying",
        "settled": "active",
        "gone": "ended",
        "changed": "verifying",
    },
    "failed": {"changed": "verifying"},
    "ended": {"changed": "verifying"},
}
STATES = tuple(TRANSITIONS)
DELIVERING = frozenset({"active", "retrying"})


class StateError(RuntimeError):
    """A move the table does not allow: a bug in the worker, never a client's error."""


class Hook:
    """A webhook pipe's options (defaults filled in) and delivery state."""

    __slots__ = (
        "attempts",
        "dead",
        "delivered",
        "due",
        "failures",
        "generation",
        "last_attempt",
        "last_error",
        "last_status",
        "options",
        "state",
    )

    def __init__(self, options: WebhookOptions) -> None:
        self.options = options
        self.state = "verifying"
        self.generation = 0  # grows when the options change: the worker starts again
        self.attempts: dict[int, int] = {}  # position -> attempts made (failed ones only)
        self.due: dict[int, float] = {}  # position -> wall time of its next attempt
        self.failures = 0  # failed attempts, all messages
        self.dead = 0  # messages given up and dead-lettered
        self.delivered = 0
        self.last_status = ""  # an HTTP status, or a word for what went wrong
        self.last_error = ""  # a short reason when the last attempt failed
        self.last_attempt: float | None = None  # wall time

    def state_value(self) -> WebhookState:
        """Its delivery state as the engine service shows it (either engine)."""
        return WebhookState(
            state=self.state,
            delivered=self.delivered,
            failures=self.failures,
            dead_lettered=self.dead,
        )

    def progress_value(self) -> WebhookProgress:
        """Where its deliveries stand, as the engine service shows it (either engine)."""
        return WebhookProgress(
            attempts=max(self.attempts.values(), default=0),
            next_attempt=min(self.due.values(), default=None),
            last_attempt=self.last_attempt,
            last_status=self.last_status,
            last_error=self.last_error,
        )

    def fire(self, event: str) -> None:
        """Move along :data:`TRANSITIONS`; an event the state does not take raises."""
        new = TRANSITIONS[self.state].get(event)
        if new is None:
            raise StateError(f"a webhook pipe cannot take {event!r} while {self.state}")
        self.state = new

    @property
    def delivering(self) -> bool:
        return self.state in DELIVERING

    def outcome(self, status: str, error: str, now: float) -> None:
        self.last_status, self.last_error, self.last_attempt = status, error, now

    def failed(self, seq: int, attempt: int, retry_at: float) -> None:
        """An attempt at the message at ``seq`` failed; the next is due at ``retry_at``."""
        self.attempts[seq] = attempt
        self.due[seq] = retry_at
        self.failures += 1
        self.fire("failed")

    def done(self, seq: int) -> None:
        """The message at ``seq`` is no longer being delivered (sent, given up, gone)."""
        self.attempts.pop(seq, None)
        self.due.pop(seq, None)
        if self.state == "retrying" and not self.attempts:
            self.fire("settled")

    def change(self, options: WebhookOptions, *, verify: bool) -> None:
        """New options (a PUT); with ``verify``, the receiver is verified again."""
        self.options = options
        self.generation += 1
        if verify:
            self.fire("changed")

    def keep_only(self, held: set[int]) -> None:
        """Forget attempts at messages that are gone (a restart lost non-persistent ones)."""
        for seq in [seq for seq in self.attempts if seq not in held]:
            self.done(seq)

    # ------------------------------------------------------------ the store
    def record(self) -> dict[str, Any]:
        return {
            "state": self.state,
            "attempts": [[seq, n, self.due.get(seq)] for seq, n in self.attempts.items()],
            "failures": self.failures,
            "dead": self.dead,
            "delivered": self.delivered,
            "last": [self.last_status, self.last_error, self.last_attempt],
        }

    def restore(self, data: dict[str, Any]) -> None:
        state = data.get("state")
        self.state = state if state in TRANSITIONS else "verifying"
        for seq, attempts, due in data.get("attempts", []):
            self.attempts[int(seq)] = int(attempts)
            if due is not None:
                self.due[int(seq)] = float(due)
        self.failures = int(data.get("failures", 0))
        self.dead = int(data.get("dead", 0))
        self.delivered = int(data.get("delivered", 0))
        self.last_status, self.last_error, self.last_attempt = data.get("last", ["", "", None])
        if self.state == "retrying" and not self.attempts:
            self.state = "active"


class _Limited(Protocol):
    @property
    def webhooks(self) -> WebhookLimits: ...


def apply_change(
    hook: Hook | None, given: object, change: WebhookOptions, config: _Limited
) -> dict[str, object] | None:
    """A PUT's webhook options on a pipe: the options to keep as given (None when
    nothing changes); 400, before any change, for a pipe of another type or a value
    over its maximum. A new callback is verified before anything is sent to it, and
    so is the same callback set again on a pipe whose verification failed or that
    ended (410)."""
    if hook is None:
        raise BadRequest("callback, secret and the delivery options are for webhook pipes")
    current = WebhookOptions(**given) if isinstance(given, dict) else WebhookOptions()
    merged = current.merged(change)
    options = config.webhooks.fill(merged)
    verify = change.callback is not None and (
        change.callback != hook.options.callback or hook.state in ("failed", "ended")
    )
    if not verify and options == hook.options:
        return None
    hook.change(options, verify=verify)
    return merged.given()
