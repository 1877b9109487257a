"""Benchmarks of the operations surface (metrics scrape, status)."""
