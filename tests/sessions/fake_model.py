"""A stand-in for an OpenAI-compatible chat endpoint, on loopback.

A real model cannot run on this machine (no model API is reachable, and no local model is
installed), so the tests talk to this: it speaks the chat completions API the product's client
(the official ``openai`` SDK) uses, keeps every request for the test to read, and answers
deterministically: the candidate numbers of a ranking prompt in reverse order; for a description,
the first element whose line holds it, or a number that is not on the menu; for a goal, the steps
``_steps`` says.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class FakeModel:
    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.failing = False
        # Cleared, the model thinks until it is set again (what a page shows meanwhile).
        self.answering = threading.Event()
        self.answering.set()

    def answer(self, request: dict[str, Any]) -> str:
        prompt = request["messages"][-1]["content"]
        lines = re.findall(r"^\[(\d+)\] (.*)$", prompt, re.MULTILINE)
        goal = re.search(r"^Goal: (.*)$", prompt, re.MULTILINE)
        if goal is not None:
            return json.dumps({"steps": self._steps(prompt, goal.group(1).casefold(), lines)})
        described = re.search(r"^Description: (.*)$", prompt, re.MULTILINE)
        if described is None:
            return json.dumps({"order": [int(n) for n, _ in reversed(lines)]})
        # Choosing an element: the first whose line holds the description, else one that is
        # not on the menu (as a model that makes something up would).
        wanted = described.group(1).casefold()
        chosen = next((int(n) for n, line in lines if wanted in line.casefold()), 999)
        return json.dumps({"number": chosen})

    @staticmethod
    def _steps(prompt: str, goal: str, lines: list[tuple[str, str]]) -> list[dict[str, Any]]:
        """Drafting: every field the goal names is filled (from the credential field of that
        name, else from a parameter of that name, else with its name), then every button or
        link it names is clicked, in the page's order."""
        said = re.search(r"^Credential fields: (.*)$", prompt, re.MULTILINE)
        fields = [f for f in (said.group(1).split(", ") if said else []) if "." in f]
        said = re.search(r"^Parameters: (.*)$", prompt, re.MULTILINE)
        parameters = said.group(1).split(", ") if said else []
        steps: list[dict[str, Any]] = []
        for number, line in lines:
            role, _, quoted = line.partition(" ")
            name = json.loads(quoted) if quoted.startswith('"') else quoted
            if name.casefold() not in goal:
                continue
            if role == "textbox":
                field = next((f for f in fields if f.split(".")[1] == name.casefold()), None)
                parameter = next((p for p in parameters if p == name.casefold()), None)
                value = (
                    {"credential": field}
                    if field
                    else {"param": parameter}
                    if parameter
                    else {"text": name}
                )
                steps.append({"do": "fill", "element": int(number), "value": value})
            elif role in ("button", "link"):
                steps.append({"do": "click", "element": int(number)})
        return steps


@contextmanager
def fake_model_server() -> Iterator[tuple[FakeModel, str]]:
    model = FakeModel()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:
            pass

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            model.requests.append({"path": self.path, **body})
            model.answering.wait(timeout=15)
            if model.failing:
                self._send(500, {"error": {"message": "the model is overloaded"}})
                return
            self._send(
                200,
                {
                    "id": "chatcmpl-fake",
                    "object": "chat.completion",
                    "created": 0,
                    "model": body["model"],
                    "choices": [
                        {
                            "index": 0,
                            "message": {"role": "assistant", "content": model.answer(body)},
                            "finish_reason": "stop",
                        }
                    ],
                    "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
                },
            )

        def _send(self, status: int, payload: dict[str, Any]) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield model, f"http://127.0.0.1:{server.server_address[1]}/v1"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
