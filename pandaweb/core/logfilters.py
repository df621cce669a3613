"""Logging filters, configured before Django's apps load (so no models are imported here)."""

from __future__ import annotations

import logging

from django.core.exceptions import PermissionDenied


class OneLineForbidden(logging.Filter):
    """A PermissionDenied is an ordinary answer (someone followed a link their role does not
    cover): log it as the one line Django writes, without the traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and isinstance(record.exc_info[1], PermissionDenied):
            record.exc_info = None
            record.exc_text = None
        return True
