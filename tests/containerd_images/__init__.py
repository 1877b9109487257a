"""Tests of the containerd-images consumer against a real containerd 1.6."""
