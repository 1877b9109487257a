"""Core benchmarks: reloadd's engine measured side by side with watchfiles in one run.

Nothing here asserts speed; each figure is measured, summarised (medians, p50/p99) and
written to docs/benchmarks-core.md together with its ratio to the peer measured in the
same run on the same files. See :mod:`bench.core.run` for the suite and how to run it.
"""
