"""Benchmarks of reloadd: ``python -m bench`` runs the core suite (see docs/benchmarks-core.md).

Sub-packages measure one area each (``bench.core`` the engine against its peers; the
consumer benchmarks live next to it under their own names).
"""
