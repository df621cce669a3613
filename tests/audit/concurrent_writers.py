"""Writers racing for the chain head, for ``test_concurrency`` (run as a script or in-process).

As a script it uses whatever database the environment configures, so the test can point it at a
real SQLite *file* with the project's production options (WAL, BEGIN IMMEDIATE, busy timeout),
which pytest-django's shared-cache in-memory database cannot stand in for.
"""

from __future__ import annotations

import json
import sys
import threading


def race(writers: int, events_per_writer: int) -> list[BaseException]:
    """Start ``writers`` threads at once, each recording events in separate transactions."""
    from django.db import connection, transaction

    from pandaweb.audit.services import audit_record

    start = threading.Barrier(writers)
    errors: list[BaseException] = []

    def write(writer: int) -> None:
        try:
            start.wait()
            for number in range(events_per_writer):
                # One transaction per event, as services do: each takes and releases the head.
                with transaction.atomic():
                    audit_record(
                        action="run.step_finished",
                        object_type="step",
                        object_id=f"{writer}-{number}",
                        run_id=writer,
                    )
        except BaseException as exc:  # reported by the caller
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=write, args=(writer,)) for writer in range(writers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    return errors


def main() -> None:
    import django

    django.setup()
    from pandaweb.audit.models import AuditEvent
    from pandaweb.audit.services import audit_verify_database

    writers, events_per_writer = int(sys.argv[1]), int(sys.argv[2])
    errors = race(writers, events_per_writer)
    result = audit_verify_database()
    report = {
        "errors": [repr(error) for error in errors],
        "sequences": list(AuditEvent.objects.values_list("sequence", flat=True)),
        "distinct_prev_hashes": AuditEvent.objects.values("prev_hash").distinct().count(),
        "ok": result.ok,
        "count": result.count,
        "reason": result.reason,
    }
    print(json.dumps(report))


if __name__ == "__main__":
    main()
