"""The admin command-line client: drives a running gateway's HTTP API."""
