"""Webhook pipes: the delivery workers and the SSRF guard."""
