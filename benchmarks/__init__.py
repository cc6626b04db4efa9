"""Benchmark and check scripts: speed and scaling figures, official-code and cross-commit
checks, DAG profiles. Each is run from the repository root as ``python -m benchmarks.<name>``
(a package: shared helpers are imported normally, no ``sys.path`` edits; only
``check_official`` puts the official third-party checkouts it compares against on it) and sits on top of
the layer contract (``pyproject.toml``): it may import any layer of the harness, and nothing
in the harness imports it."""
