"""The event stream's fan-out, for ``bench/api.py`` (not a benchmark of its own).

daphne serves the real ASGI application as its own process (``manage.py up``'s command, scale-out
settings: the benchmark's PostgreSQL database and Redis, no run execution); the benchmark process
sends its channel-layer messages through the same Redis.
Clients open ``GET /api/v1/events`` over real HTTP on loopback (several tokens: each may hold only
a few streams) and read every chunk as it comes. The benchmark process then commits step events
one at a time the way the runner's writer does (``lock_run`` + ``event_append`` in one
transaction) and stamps each right after its commit; every client stamps each event it receives.
Latency is receive minus commit over every client and event. One client and many alternate, round by
round, with fresh tokens each time.
"""

from __future__ import annotations

import asyncio
import math
import os
import random
import statistics
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from _harness import ROOT, free_port, load_line, wait_for

T = TypeVar("T")


@dataclass
class Client:
    token: str
    opened: asyncio.Future[None]
    received: dict[int, float] = field(default_factory=dict)
    writer: asyncio.StreamWriter | None = None


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def summary(label: str, seconds: list[float]) -> str:
    ms = [s * 1000 for s in seconds]
    return (
        f"{label:<34} n={len(ms):<5} p50 {statistics.median(ms):6.1f}  p95 {pct(ms, 95):6.1f}  "
        f"max {max(ms):6.1f} ms"
    )


async def _read_stream(port: int, client: Client) -> None:
    """One SSE client: stamps each event id as its chunk arrives, until the server or the
    benchmark closes the connection."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    client.writer = writer
    writer.write(
        (
            f"GET /api/v1/events HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
            f"Authorization: Bearer {client.token}\r\nAccept: text/event-stream\r\n\r\n"
        ).encode()
    )
    await writer.drain()
    status = await reader.readline()
    if b" 200 " not in status:
        client.opened.set_exception(RuntimeError(f"the stream was refused: {status!r}"))
        return
    chunked = False
    while (header := await reader.readline()) not in (b"\r\n", b""):
        chunked |= header.lower().startswith(b"transfer-encoding:") and b"chunked" in header
    pending = ""
    try:
        while True:
            if chunked:
                size = int((await reader.readline()).split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    return
                data = (await reader.readexactly(size + 2))[:-2]
            else:
                data = await reader.read(65536)
                if not data:
                    return
            now = time.perf_counter()
            pending += data.decode()
            while "\n\n" in pending:
                message, pending = pending.split("\n\n", 1)
                for line in message.splitlines():
                    if line.startswith("retry:") and not client.opened.done():
                        client.opened.set_result(None)
                    elif line.startswith("id: "):
                        client.received[int(line[4:])] = now
    except (asyncio.IncompleteReadError, ConnectionError):
        return


class ClientLoop:
    """The clients' event loop, on a thread of its own: the benchmark's thread commits."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coroutine: Coroutine[Any, Any, T], timeout: float = 60) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


async def _open(port: int, tokens: list[str], count: int) -> tuple[list[Client], list[Any]]:
    loop = asyncio.get_running_loop()
    clients = [
        Client(token=tokens[i % len(tokens)], opened=loop.create_future()) for i in range(count)
    ]
    tasks = [asyncio.create_task(_read_stream(port, client)) for client in clients]
    async with asyncio.timeout(60):
        await asyncio.gather(*(c.opened for c in clients))
    return clients, tasks


async def _close(clients: list[Client], tasks: list[Any]) -> None:
    for client in clients:
        if client.writer is not None:
            client.writer.close()
    await asyncio.gather(*tasks, return_exceptions=True)


def _answers(url: str) -> bool:
    try:
        urllib.request.urlopen(url, timeout=2)  # noqa: S310 (loopback)
    except urllib.error.HTTPError as error:
        return error.code == 401
    except OSError:
        return False
    return False


def measure(
    *,
    data_dir: Path,
    redis_url: str,
    operator: Any,
    run_ids: list[int],
    clients: int,
    events: int,
    rounds: int,
) -> None:
    from django.db import connection, transaction
    from django.test.utils import CaptureQueriesContext, override_settings

    from pandaweb.api import events_stream
    from pandaweb.api.services import token_create
    from sessions.models import RunEvent
    from sessions.services.records import event_append, lock_run

    made = iter(range(10**6))

    def tokens(count: int) -> list[str]:
        return [
            token_create(
                actor=operator, owner=operator, name=f"bench-events-{next(made)}",
                scopes=["runs:read"], expires_at=None,
            )[1]
            for _ in range(count)
        ]  # fmt: skip

    def step_done(run_id: int) -> tuple[int, float]:
        """What the runner's writer does for a finished step; the time right after COMMIT (this
        callback is registered first, so it runs before the channel-layer message is sent)."""
        committed: list[float] = []
        with transaction.atomic():
            transaction.on_commit(lambda: committed.append(time.perf_counter()))
            run = lock_run(run_id)
            event = event_append(run, "step", {"index": run.last_event_seq, "status": "succeeded"})
            run.save(update_fields=["last_event_seq"])
        return event.pk, committed[0]

    # Which runs get the events, and when: repeatable, not secret.
    rng = random.Random(30)  # noqa: S311
    # What one read of a stream costs the server, measured here on the server's own function.
    token = tokens(1)[0]
    events_stream.events_read(raw_token=token, after=0, flt=events_stream.StreamFilter())
    latest = RunEvent.objects.order_by("-pk").values_list("pk", flat=True).first() or 0
    with CaptureQueriesContext(connection) as nothing_new:
        events_stream.events_read(raw_token=token, after=latest, flt=events_stream.StreamFilter())
    one, _ = step_done(rng.choice(run_ids))
    with CaptureQueriesContext(connection) as one_new:
        events_stream.events_read(raw_token=token, after=one - 1, flt=events_stream.StreamFilter())
    print(
        f"event stream, queries per read: {len(nothing_new)} with nothing new, "
        f"{len(one_new)} with one step event"
    )

    # The channel layer settings.py makes from REDIS_URL, here only: the rest of bench/api.py
    # measures without Redis.
    channel_layers = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            "CONFIG": {"hosts": [{"address": redis_url}], "prefix": "pandaweb:channels"},
        }
    }
    port = free_port()
    env = {
        **os.environ,
        "REDIS_URL": redis_url,
        # Names daphne's database sessions, to count them.
        "PGAPPNAME": "bench-daphne",
        "PANDAWEB_PORT": str(port),
        "PANDAWEB_ALLOWED_HOSTS": "127.0.0.1",
        # The dashboard of the scale-out stack: it serves, workers (none here) execute.
        "PANDAWEB_RUN_EXECUTION": "celery",
    }
    from pandaweb.supervisor import dashboard_argv

    log = data_dir / "daphne.log"
    with open(log, "wb") as out:
        daphne = subprocess.Popen(
            dashboard_argv(sys.executable, "127.0.0.1", port),
            cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    loop = ClientLoop()
    layer = override_settings(CHANNEL_LAYERS=channel_layers)
    layer.enable()
    try:
        url = f"http://127.0.0.1:{port}/api/v1/events"
        wait_for(lambda: daphne.poll() is not None or _answers(url), 60, "daphne")
        if daphne.poll() is not None:
            raise SystemExit(f"daphne stopped:\n{log.read_text()[-2000:]}")
        by_variant: dict[int, list[float]] = {1: [], clients: []}
        for round_number in range(1, rounds + 1):
            for count in (1, clients):
                phase_load = load_line()
                streams, tasks = loop.run(
                    _open(port, tokens(math.ceil(count / events_stream.STREAMS_PER_TOKEN)), count)
                )
                with connection.cursor() as cursor:
                    cursor.execute(
                        "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s",
                        ["bench-daphne"],
                    )
                    held = cursor.fetchone()[0]
                committed: dict[int, float] = {}
                for _ in range(events):
                    # Off any poll's beat: the gaps are random.
                    time.sleep(rng.uniform(0.15, 0.35))
                    event_id, at = step_done(rng.choice(run_ids))
                    committed[event_id] = at
                wait_for(
                    lambda sent=committed, got=streams: all(
                        sent.keys() <= s.received.keys() for s in got
                    ),
                    30,
                    "every client to receive every event",
                )
                loop.run(_close(streams, tasks))
                latencies = [
                    stream.received[event_id] - at
                    for stream in streams
                    for event_id, at in committed.items()
                ]
                by_variant[count].extend(latencies)
                print(
                    summary(f"SSE round {round_number}, {count:>2} client(s)", latencies)
                    + f"  daphne's database connections {held}  ({phase_load})",
                    flush=True,
                )
        for count, latencies in by_variant.items():
            print(summary(f"SSE commit → client, {count:>2} client(s)", latencies))
    finally:
        layer.disable()
        loop.stop()
        daphne.terminate()
        try:
            daphne.wait(timeout=30)
        except subprocess.TimeoutExpired:
            daphne.kill()
            daphne.wait(timeout=10)
