"""Federation links: a feed shared with a feed of another RestMS gateway, pushed or
pulled over HTTP, loop-safe and deduplicated (docs/FEDERATION.md)."""
