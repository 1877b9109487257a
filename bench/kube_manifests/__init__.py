"""Benchmark of the kube-manifests consumer (run: python -m bench.kube_manifests)."""
