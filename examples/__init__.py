"""Examples (a package so that ``python -m examples.demo.run_demo`` can import ``tests.infra``)."""
