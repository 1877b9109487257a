"""Operations services: they read the pipeline's snapshot and nothing else (see docs/architecture.md)."""
