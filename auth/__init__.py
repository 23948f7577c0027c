"""Authentication and access policy, framework-free (docs/AUTH.md).

``principals``: who a request acts as, guests, configured users, tenants;
``scopes``: what a principal may do where; ``tokens``: bearer-token checks;
``issuer`` and ``clients``: the built-in authorization server; ``limits``: rate limits.
"""

from .principals import GUEST, Guests, Principal, Tenants, User, is_loopback
from .scopes import ACTIONS, Grants, grants

__all__ = [
    "ACTIONS",
    "GUEST",
    "Grants",
    "Guests",
    "Principal",
    "Tenants",
    "User",
    "grants",
    "is_loopback",
]
