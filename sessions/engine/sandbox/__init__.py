"""Sandboxes: one isolated browser per run, reached over CDP (no Django imports).

``get_backend("local").create(SandboxSpec(...))`` returns a ``Sandbox`` record; ``to_dict()`` /
``from_dict()`` carry it to the process that later continues, extends or destroys it. The
interface is ``sessions.engine.sandbox.base``; ``get_backend`` (in
``sessions.engine.sandbox.backends``) knows every backend. This package imports nothing itself:
the watchdog runs as ``python -m sessions.engine.sandbox.watchdog``, next to a browser competing
for the same CPUs, and should not pay for modules it never uses.
"""
