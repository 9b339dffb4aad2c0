"""pytest-dlcheck: catch the silent bugs of deep-learning training pipelines on your real objects.

Importing this package imports neither torch nor any domain library."""

__version__ = "0.1.0"
