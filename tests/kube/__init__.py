"""Test infrastructure: a real kube-apiserver (+ etcd, kube-controller-manager) on loopback."""
