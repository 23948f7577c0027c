"""Contract tests: the OpenAPI description against a live gateway (docs/API.md)."""
