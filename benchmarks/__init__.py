"""pytest-dlcheck's performance benchmark: ``python benchmarks/run.py`` (see benchmarks/README.md)."""
