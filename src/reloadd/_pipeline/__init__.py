"""The pipeline: settle, decide, queue, hand over (see docs/architecture.md)."""
