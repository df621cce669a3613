#!/usr/bin/env python
from __future__ import annotations

import os
import sys

from pandaweb.localfiles import ensure_local_files


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "pandaweb.settings")
    # The embedded default's keys are made here, by an entry point; the settings only read them.
    ensure_local_files()
    from django.conf import settings
    from django.core.exceptions import ImproperlyConfigured
    from django.core.management import execute_from_command_line

    try:
        # Load settings first so that a bad environment variable reads as one line, not a
        # traceback through Django's internals.
        settings.INSTALLED_APPS  # noqa: B018
    except ImproperlyConfigured as exc:
        print(f"pandaweb: configuration error: {exc}", file=sys.stderr)
        sys.exit(2)
    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
