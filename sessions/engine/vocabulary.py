"""Words the engine and the dashboard share. Light on purpose: the web side imports it, and must
not load the browser side to say how a secret looks."""

from __future__ import annotations

# What a secret looks like wherever a person reads it (evidence, sentences, the live view, answers).
MASK = "••••"
# Credential fields that are not secret: shown where they are typed, never masked.
PUBLIC_CREDENTIAL_FIELDS = frozenset({"username"})
# Why a run failed whose session template's fork woke up logged out.
STALE_SESSION = "session template is stale — re-bake"
