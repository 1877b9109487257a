"""Benchmark of the registry-mirrors consumer (run: python -m bench.registry_mirrors)."""
