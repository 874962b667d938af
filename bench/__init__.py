"""Benchmark scripts (run them as files: see bench/README.md)."""
