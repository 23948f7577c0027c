"""Benchmarks for the RestMS gateway; run with ``bench/run`` (see docs/BENCHMARKS.md)."""
