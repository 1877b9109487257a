"""``make demo``: reloadd on a private containerd and a local registry."""
