"""An OpenAI-compatible chat endpoint (a hosted API, or a local server such as vLLM or Ollama),
through the official SDK. No Django: the worker's side (``calling``) hands it the endpoint it is
configured with. Loaded by workers only: the SDK takes ~0.4 s to import."""

from __future__ import annotations

from dataclasses import dataclass

from openai import DefaultHttpxClient, OpenAI, OpenAIError

from pandaweb.assist.errors import ModelUnavailable


@dataclass(frozen=True)
class ChatModel:
    url: str
    model: str
    key: str
    timeout_seconds: float = 20.0

    def ask(self, system: str, question: str) -> str:
        """The model's answer to ``question`` (one turn, temperature 0)."""
        client = OpenAI(
            base_url=self.url,
            api_key=self.key or "none",
            timeout=self.timeout_seconds,
            # A failed call is reported, not retried: a person is waiting on the page.
            max_retries=0,
            # The endpoint configured, and nothing the environment's proxy settings add.
            http_client=DefaultHttpxClient(trust_env=False),
        )
        try:
            answer = client.chat.completions.create(
                model=self.model,
                temperature=0,
                messages=[
                    {"role": "system", "content": system},
                    {"role": "user", "content": question},
                ],
            )
        except OpenAIError as exc:
            raise ModelUnavailable(f"the model at {self.url} did not answer: {exc}") from None
        finally:
            client.close()
        content = answer.choices[0].message.content if answer.choices else None
        if not content:
            raise ModelUnavailable(f"the model at {self.url} gave an empty answer")
        return content
