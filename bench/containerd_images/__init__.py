"""Benchmarks of the containerd-images consumer against ``ctr images import``."""
