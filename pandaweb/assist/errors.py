"""The error both sides of assistance share: the web side raises it when no model is configured,
the worker's client when the model does not answer. Here, not in the client, so the web side
can name it without loading the model's SDK."""

from __future__ import annotations


class ModelUnavailable(Exception):
    """The model cannot be asked, or did not answer; the message is for people."""
