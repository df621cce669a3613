"""A pytest plugin (``-p pandaweb.testing`` in pyproject.toml): the test run is an entry point like
manage.py, so it creates the embedded default's key files before pytest-django reads the
settings, which only read them."""

from __future__ import annotations

from pandaweb.localfiles import ensure_local_files

ensure_local_files()
