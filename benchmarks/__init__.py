"""Benchmark helpers for `python -m launch.benchmark` (not part of the library)."""
