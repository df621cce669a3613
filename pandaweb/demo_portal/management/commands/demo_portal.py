"""``manage.py demo_portal``: run the Acme Supplier Portal demo site in the foreground."""

from __future__ import annotations

import ipaddress
import signal
import threading
from argparse import ArgumentParser
from types import FrameType
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from pandaweb.demo_portal.server import make_server
from pandaweb.demo_portal.state import DEMO_PASSWORD, DEMO_USERNAME


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class Command(BaseCommand):
    help = "Run the Acme Supplier Portal, the offline demo site the browser robots drive."

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("--host", default="127.0.0.1", help="loopback address to listen on")
        parser.add_argument("--port", type=int, default=8001, help="port (0 picks a free one)")

    def handle(self, *args: Any, **options: Any) -> None:
        host: str = options["host"]
        # The demo login is published: anyone who can reach the portal can "pay" with it.
        if not is_loopback(host):
            raise CommandError(f"Refusing to listen on {host}: the demo portal is loopback-only.")
        try:
            server = make_server(host, options["port"])
        except OSError as error:
            raise CommandError(f"Cannot listen on {host}:{options['port']}: {error}") from error

        stop = threading.Event()

        def request_stop(signum: int, frame: FrameType | None) -> None:
            stop.set()

        previous = {
            signum: signal.signal(signum, request_stop)
            for signum in (signal.SIGINT, signal.SIGTERM)
        }
        # serve_forever runs in a thread because shutdown() blocks until it returns, which it
        # could never do if called from a signal handler interrupting it in the same thread.
        thread = threading.Thread(target=server.serve_forever, name="demo-portal", daemon=True)
        thread.start()
        url_host = f"[{host}]" if ":" in host else host
        self.stdout.write(
            f"Acme Supplier Portal on http://{url_host}:{server.server_port}/ "
            f"(login {DEMO_USERNAME} / {DEMO_PASSWORD})"
        )
        self.stdout.flush()
        try:
            stop.wait()
        finally:
            server.shutdown()
            server.server_close()
            thread.join()
            for signum, handler in previous.items():
                signal.signal(signum, handler)
        self.stdout.write("Acme Supplier Portal stopped.")
