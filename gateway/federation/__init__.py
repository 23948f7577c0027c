"""The gateway's side of federation links: the HTTP client they reach remote gateways
with (docs/FEDERATION.md)."""
