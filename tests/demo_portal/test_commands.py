from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import urllib.request

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from pandaweb.demo_portal.management.commands.demo_portal import Command as PortalCommand
from pandaweb.demo_portal.management.commands.demo_portal import is_loopback
from pandaweb.demo_portal.management.commands.demo_portal_reset import Command as ResetCommand
from pandaweb.demo_portal.server import PortalServer
from pandaweb.demo_portal.state import DEMO_USERNAME, PAYEE_IBAN

# Runs the command in its own process with minimal settings, so that signals reach it as they
# would from a terminal or a process manager.
_RUN_PORTAL = """
import django
from django.conf import settings
from django.core.management import call_command

settings.configure()
django.setup()
from pandaweb.demo_portal.management.commands.demo_portal import Command

call_command(Command(), port=0)
"""


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "portal.internal", ""])  # noqa: S104
def test_it_refuses_a_non_loopback_host(host: str) -> None:
    with pytest.raises(CommandError, match="loopback-only"):
        call_command(PortalCommand(), host=host, port=0)


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2", "::1", "localhost"])
def test_loopback_hosts_are_accepted(host: str) -> None:
    assert is_loopback(host)


@pytest.mark.parametrize("stop_signal", [signal.SIGTERM, signal.SIGINT])
def test_the_portal_command_serves_until_stopped(stop_signal: signal.Signals) -> None:
    process = subprocess.Popen(
        [sys.executable, "-c", _RUN_PORTAL],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        assert process.stdout is not None
        banner = process.stdout.readline()
        assert banner.startswith("Acme Supplier Portal on http://127.0.0.1:")
        assert banner.rstrip().endswith("(login acme-demo / portal-demo-2026)")
        url = banner.split()[4]
        with urllib.request.urlopen(f"{url}login", timeout=5) as response:  # noqa: S310
            assert b"Sign in" in response.read()

        process.send_signal(stop_signal)
        stdout, stderr = process.communicate(timeout=10)
    finally:
        process.kill()
        process.wait()
    assert process.returncode == 0, stderr
    assert "stopped" in stdout


def test_the_reset_command_resets_a_running_portal(
    portal_server: PortalServer, portal: str, capsys: pytest.CaptureFixture[str]
) -> None:
    state = portal_server.state
    invoice = state.invoices()[0]
    draft = state.create_draft(DEMO_USERNAME, invoice.number, invoice.amount_due, PAYEE_IBAN, "x")
    state.submit_draft(draft.token, DEMO_USERNAME, invoice.number)

    call_command(ResetCommand(), url=portal)

    assert state.payments() == []
    assert "reset" in capsys.readouterr().out


def test_the_reset_command_explains_a_portal_that_is_not_running() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    # Nothing listens on the port once the probe socket is closed.
    with pytest.raises(CommandError, match="not running"):
        call_command(ResetCommand(), url=f"http://127.0.0.1:{port}")
