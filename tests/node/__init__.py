"""Tests on the test bed's real node (the session fixture ``kube_node``)."""
