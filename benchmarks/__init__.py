"""Benchmark helpers for `jaxillusions benchmark` (not part of the library)."""
