"""What each consumer acknowledged, crash-safe (see docs/architecture.md)."""
