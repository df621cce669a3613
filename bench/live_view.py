"""Live view: frame latency and the extra CPU of one viewer at 5 frames a second.

    .venv/bin/python bench/live_view.py [--rounds 3] [--seconds 10] [--fps 5]

A local headless Chromium shows a page whose counter changes ten times a second (a page that
is always repainting, the worst case for a screencast). The run's live feed (``sessions.live``,
the code a worker runs) is attached to it as for a run, and a stand-in viewer on another event
loop does what the viewer's consumer does: says it is there every two seconds, receives the
masked frames through the channel layer (the embedded in-memory one), keeps at most ``--fps``
a second and builds each as the (binary) websocket message it would send.

Two variants, alternated ``--rounds`` times for ``--seconds`` each: nobody watching (the feed
is attached but casts nothing: the baseline) and one viewer. CPU is the browser's processes
plus this process, in seconds of CPU per second of wall time, as a percentage of one core;
the extra CPU of a viewer is the difference between the two variants' medians. Latency is from
the browser's timestamp of a frame (its compositor clock, the same machine's wall clock) to the
viewer's message being ready: p50 and p95 over every frame of every viewer round.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "pandaweb.settings")
os.environ.setdefault("PANDAWEB_DATA_DIR", tempfile.mkdtemp(prefix="pandaweb-bench-live-"))
os.environ.pop("REDIS_URL", None)  # the embedded default: in-memory channel layer

import django  # noqa: E402

from pandaweb.localfiles import ensure_local_files  # noqa: E402

ensure_local_files()
django.setup()

from channels.layers import get_channel_layer  # noqa: E402
from django.conf import settings  # noqa: E402
from playwright.sync_api import sync_playwright  # noqa: E402

from sessions.consumers import frame_message  # noqa: E402
from sessions.engine.chromium import HEADLESS_ARGS, find_chromium  # noqa: E402
from sessions.events import run_feed_group, run_live_group  # noqa: E402
from sessions.layer import layer_send, receive_group_on_this_loop  # noqa: E402
from sessions.live import LiveFeed  # noqa: E402

RUN_ID = 1
PAGE = """<!doctype html><title>Ticking</title>
<style>body { font: 24px sans-serif; margin: 2rem; } input { font: 20px monospace; }</style>
<h1>Checking your browser… <span id="n">0</span></h1>
<p><label for="pw">Password</label> <input id="pw" type="password" value="hunter2hunter2"></p>
<p><label for="token">API token</label> <input id="token" value="s3cret-token"></p>
<script>let n = 0; setInterval(() => { n += 1;
  document.getElementById('n').textContent = n + ' · ' + Date.now(); }, 100);</script>"""


class Viewer:
    """What one viewer's consumer does, on a loop of its own thread."""

    def __init__(self, fps: float) -> None:
        self.interval = 1 / fps
        self.latencies: list[float] = []
        self.masked: list[int] = []
        self.sent_bytes = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self._task: Any = None

    def watch(self) -> None:
        self._task = asyncio.run_coroutine_threadsafe(self._watch(), self._loop)

    def leave(self) -> None:
        if self._task is not None:
            self._task.cancel()
            time.sleep(0.3)
            asyncio.run_coroutine_threadsafe(self._say(present=False), self._loop).result(5)

    async def _say(self, *, present: bool) -> None:
        await layer_send(
            run_feed_group(RUN_ID),
            {"type": "live.watching", "channel": self.channel, "user_id": 1, "present": present},
        )

    async def _watch(self) -> None:
        layer = get_channel_layer()
        self.channel = await layer.new_channel("viewer.")
        await layer.group_add(run_live_group(RUN_ID), self.channel)
        receive_group_on_this_loop(run_live_group(RUN_ID))
        last_frame = 0.0
        presence = asyncio.create_task(self._presence())
        try:
            while True:
                message = await layer.receive(self.channel)
                if message["type"] != "live.frame":
                    continue
                now = time.monotonic()
                if now - last_frame < self.interval:
                    continue
                last_frame = now
                sent = frame_message(message)
                self.latencies.append(time.time() - message["captured_at"])
                self.masked.append(message["masks"])
                self.sent_bytes += len(sent)
        finally:
            presence.cancel()
            await layer.group_discard(run_live_group(RUN_ID), self.channel)

    async def _presence(self) -> None:
        while True:
            await self._say(present=True)
            await asyncio.sleep(2)


def cpu_seconds(processes: list[psutil.Process]) -> float:
    total = 0.0
    for process in processes:
        try:
            times = process.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += times.user + times.system
    return total


def measure(browser: psutil.Process, seconds: float) -> tuple[float, float]:
    """Percent of one core used over ``seconds`` by the browser's processes, and by this one
    (the feed, the masking, the channel layer and the stand-in viewer)."""
    browser_side = [browser, *browser.children(recursive=True)]
    ours = [psutil.Process()]
    before, wall = (cpu_seconds(browser_side), cpu_seconds(ours)), time.monotonic()
    time.sleep(seconds)
    elapsed = time.monotonic() - wall
    return (
        100 * (cpu_seconds(browser_side) - before[0]) / elapsed,
        100 * (cpu_seconds(ours) - before[1]) / elapsed,
    )


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="rounds of each variant")
    parser.add_argument("--seconds", type=float, default=10.0, help="seconds per round")
    parser.add_argument("--fps", type=float, default=5.0, help="the viewer's frame rate")
    args = parser.parse_args()

    binary = find_chromium(settings.ENGINE_CONFIG.chromium)
    if binary is None:
        print("no Chromium on this machine")
        return 1
    profile = Path(tempfile.mkdtemp(prefix="pandaweb-bench-live-profile-"))
    process = subprocess.Popen(
        [binary, "--headless=new", *HEADLESS_ARGS, "--remote-debugging-port=0",
         f"--user-data-dir={profile}", "--window-size=1280,720", "about:blank"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    port_file = profile / "DevToolsActivePort"
    while not port_file.is_file() or not port_file.read_text().strip():
        time.sleep(0.05)
    cdp_url = f"http://127.0.0.1:{port_file.read_text().split()[0]}"
    browser = psutil.Process(process.pid)
    playwright = sync_playwright().start()
    try:
        page = playwright.chromium.connect_over_cdp(cdp_url).contexts[0].pages[0]
        page.set_content(PAGE)
        feed = LiveFeed(
            run_id=RUN_ID,
            cdp_url=cdp_url,
            secret_values=["s3cret-token"],
            secret_fields=[],
            files_dir=profile / "files",
        )
        feed.max_fps = args.fps
        feed.start()
        viewer = Viewer(args.fps)
        idle: list[tuple[float, float]] = []
        watched: list[tuple[float, float]] = []
        time.sleep(2)
        for _ in range(args.rounds):
            idle.append(measure(browser, args.seconds))
            viewer.watch()
            time.sleep(1)  # the feed notices the viewer and starts casting
            watched.append(measure(browser, args.seconds))
            viewer.leave()
            time.sleep(1)
        tap = feed.tap
        made, shown, masking = (
            (tap.frames_made, tap.frames_shown, tap.mask_seconds) if tap else (0, 0, 0.0)
        )
        feed.stop()
    finally:
        playwright.stop()
        process.kill()
        process.wait()

    print(f"live view, one viewer at {args.fps:g} fps, {args.rounds} x {args.seconds:g} s rounds")
    print(f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f} at the end")
    print(f"frames received: {len(viewer.latencies)} (masked fields per frame: "
          f"{min(viewer.masked, default=0)}-{max(viewer.masked, default=0)})")  # fmt: skip
    per_message = viewer.sent_bytes / max(len(viewer.latencies), 1) / 1024
    print(f"frames the browser made: {made}, masked and sent: {shown}; masking "
          f"{1000 * masking / max(shown, 1):.1f} ms CPU a frame; "
          f"{per_message:.0f} KiB a message")  # fmt: skip
    if viewer.latencies:
        print(
            f"frame latency: p50 {1000 * statistics.median(viewer.latencies):.0f} ms, "
            f"p95 {1000 * percentile(viewer.latencies, 0.95):.0f} ms, "
            f"max {1000 * max(viewer.latencies):.0f} ms"
        )
    base = statistics.median(b + o for b, o in idle)
    seen = statistics.median(b + o for b, o in watched)
    print(f"CPU, nobody watching (baseline): {base:.1f}% of one core "
          f"(rounds: {', '.join(f'{b + o:.1f}' for b, o in idle)})")  # fmt: skip
    print(f"CPU, one viewer:                  {seen:.1f}% of one core "
          f"(rounds: {', '.join(f'{b + o:.1f}' for b, o in watched)})")  # fmt: skip
    browser_extra = statistics.median(b for b, _ in watched) - statistics.median(b for b, _ in idle)
    ours_extra = statistics.median(o for _, o in watched) - statistics.median(o for _, o in idle)
    print(f"extra CPU of one viewer: {seen - base:.1f}% of one core (target: at most 10%): "
          f"the browser's processes {browser_extra:.1f}%, the feed and viewer "
          f"{ours_extra:.1f}%")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
