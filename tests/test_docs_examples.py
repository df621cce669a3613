"""Every shell example in README.md and docs/*.md runs as written, against a live stack.

An example is a fenced ``sh`` or ``bash`` block. One that cannot run in a test (it starts the
stack, installs packages, or needs a deployment) says why in an HTML comment on the line before
it: ``<!-- not run: why -->``. The others run command by command with ``set -euo pipefail``,
``python`` being this interpreter, ``curl`` failing on an HTTP error, against the stack's
dashboard instead of http://127.0.0.1:8000. The examples' placeholders are filled in as a reader
would: ``pw_…`` with a token of the variable's owner, ``42`` with the run the example launched,
``7`` and ``<evidence_sha256 from the request>`` with that run's approval request once it waits,
``<base64 public key>`` with what ``audit_public_key`` prints.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import ROOT, Stack, e2e_database_url, fake_model, live_stack, stack

__all__ = ["e2e_database_url", "fake_model", "live_stack", "stack"]

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
NOT_RUN = re.compile(r"<!-- not run: (.+?) -->\s*$")
SHELL = {"sh", "bash", "shell"}
# The run an example launched, as the examples after it write it.
RUN = r"\b42\b"


@dataclass
class Example:
    path: Path
    line: int
    text: str
    not_run: str

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def examples() -> list[Example]:
    found = []
    for path in DOCS:
        text = path.read_text()
        for match in FENCE.finditer(text):
            if match.group(1) not in SHELL:
                continue
            before = text[: match.start()].rstrip("\n").rsplit("\n", 1)[-1]
            reason = NOT_RUN.search(before)
            line = text.count("\n", 0, match.start()) + 1
            found.append(Example(path, line, match.group(2), reason.group(1) if reason else ""))
    return found


def commands(text: str) -> list[str]:
    """One entry per shell command: continuation lines joined, comments and blanks left out."""
    out, current = [], ""
    for raw in text.splitlines():
        if not current and (not raw.strip() or raw.lstrip().startswith("#")):
            continue
        current += raw + "\n"
        if not raw.rstrip().endswith("\\"):
            out.append(current)
            current = ""
    return out


def test_every_example_that_does_not_run_says_why() -> None:
    skipped = [e for e in examples() if e.not_run]

    assert all(len(e.not_run) > 10 for e in skipped)
    # A few at most: an example nobody runs is an example nobody knows to be right.
    assert len(skipped) <= len(examples()) // 2


@dataclass
class Reader:
    """The reader's shell session: their tokens, what the examples answered so far."""

    stack: Stack
    cwd: Path
    tokens: dict[str, str]
    facts: dict[str, str] = field(default_factory=dict)

    def fill(self, command: str) -> str:
        command = command.replace("http://127.0.0.1:8000", self.stack.url)
        for name, token in self.tokens.items():
            command = re.sub(rf"^{name}=pw_…", f"{name}={token}", command)
        if "approvals/7" in command or "evidence_sha256 from" in command:
            self.wait_for_request()
        for placeholder, value in self.facts.items():
            command = re.sub(placeholder, value, command)
        if "<base64 public key>" in command:
            key = self.stack.manage("audit_public_key").split()[0]
            command = command.replace("<base64 public key>", key)
        return command

    def run(self, example: Example, command: str) -> str:
        script = (
            "set -euo pipefail\n"
            f'python() {{ if [ "${{1:-}}" = manage.py ]; then shift; '
            f'"{sys.executable}" "{ROOT}/manage.py" "$@"; else "{sys.executable}" "$@"; fi; }}\n'
            'curl() { command curl --fail-with-body --max-time 60 "$@"; }\n' + self.fill(command)
        )
        # The reader's shell has the project's virtualenv active (``pandaweb`` on the PATH) and
        # the client command's token set, as docs/api.md says for its examples.
        environment = {
            **self.stack.env,
            **self.tokens,
            "PANDAWEB_TOKEN": self.tokens["TOKEN"],
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{self.stack.env.get('PATH', '')}",
        }
        result = subprocess.run(
            ["bash", "-c", script],
            cwd=self.cwd,
            env=environment,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        said = f"{result.stdout}\n{result.stderr}"
        assert result.returncode == 0, f"{example.where}: {command}exit {result.returncode}\n{said}"
        self.learn(result.stdout)
        return result.stdout

    def learn(self, output: str) -> None:
        """A launch's answer names the run that ``42`` stands for in the lines after it."""
        try:
            answer = json.loads(output)
        except ValueError:
            return
        # A run has an id, a workflow and a status (a session template has no id).
        if isinstance(answer, dict) and {"id", "status", "workflow"} <= answer.keys():
            self.facts[RUN] = str(answer["id"])

    def wait_for_request(self) -> None:
        if r"/approvals/7\b" in self.facts:
            return
        deadline = time.monotonic() + 120
        while True:
            pending = self.api("REVIEWER_TOKEN", "/approvals/")
            requests = [self.api("REVIEWER_TOKEN", f"/approvals/{a['id']}") for a in pending]
            mine = [r for r in requests if str(r["run"]) == self.facts[RUN]]
            if mine:
                break
            run = self.api("TOKEN", "/runs/" + self.facts[RUN])
            assert run["finished_at"] is None, f"the example's run ended: {run}"
            assert time.monotonic() < deadline, self.stack.log_tail()
            time.sleep(0.5)
        request = mine[0]
        self.facts[r"/approvals/7\b"] = f"/approvals/{request['id']}"
        self.facts["<evidence_sha256 from the request>"] = request["evidence_sha256"]

    def api(self, owner: str, path: str) -> Any:
        request = urllib.request.Request(  # noqa: S310 (the stack on loopback)
            f"{self.stack.url}/api/v1{path}",
            headers={"Authorization": f"Bearer {self.tokens[owner]}"},
        )
        with urllib.request.urlopen(request, timeout=10) as answer:  # noqa: S310
            return json.load(answer)


@pytest.mark.e2e
def test_every_shell_example_runs_as_written(stack: Stack, tmp_path: Path) -> None:
    stack.manage("demo_workflow")  # the demo data the examples name, as scripts/quickstart loads
    tokens = {
        "TOKEN": stack.manage(
            "api_token", "docs-erp", "--name", "docs", "--service", "--by", "ada.admin",
            "--role", "Operators", "--role", "Compliance",
            "--scope", "runs:launch", "--scope", "runs:read", "--scope", "audit:read",
            "--scope", "workflows:read", "--scope", "schedules:write",
        ).strip(),
        "REVIEWER_TOKEN": stack.manage(
            "api_token", "rory.reviewer", "--name", "docs",
            "--scope", "approvals:read", "--scope", "approvals:decide",
        ).strip(),
        "ADMIN_TOKEN": stack.manage(
            "api_token", "ada.admin", "--name", "docs",
            "--scope", "webhooks:read", "--scope", "tokens:read", "--scope", "tokens:write",
            "--scope", "system:read", "--scope", "teams:read", "--scope", "teams:write",
        ).strip(),
    }  # fmt: skip
    readers: dict[Path, Reader] = {}
    ran = 0
    for example in examples():
        if example.not_run:
            continue
        reader = readers.setdefault(example.path, Reader(stack, tmp_path, tokens))
        for command in commands(example.text):
            reader.run(example, command)
            ran += 1

    assert ran >= 10
