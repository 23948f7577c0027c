"""Authentication and access policy, framework-free (OAuth arrives with issue 4)."""

from .principals import GUEST, is_loopback, principal_for

__all__ = ["GUEST", "is_loopback", "principal_for"]
