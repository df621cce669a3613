"""What the run core announces to the layers above it, so it never calls up into them.

``run_transitioned`` is sent by ``transition()`` inside its transaction, after the run's row, its
status event and its audit row are written: a receiver's writes commit or roll back with the move.
Receivers connect in their app's ``AppConfig.ready``.
"""

from __future__ import annotations

from django.dispatch import Signal

# Keyword arguments: ``run`` (locked and saved), ``before`` and ``to`` (statuses).
run_transitioned = Signal()
