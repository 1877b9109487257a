"""``python -m bench [--quick]``: run the core benchmark suite and write docs/benchmarks-core.md."""

from bench.core.run import main

raise SystemExit(main())
