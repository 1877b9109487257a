"""Integration tests of the kube-manifests consumer against a real kube-apiserver."""
