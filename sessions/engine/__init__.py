"""The engine: what drives a run's browser, with no Django (checked by import-linter).

The runner (steps to Playwright, the approval gate and its evidence), what it observes and
pictures, the live view's CDP client, the warm Playwright driver, the egress proxy, the outcome
of an irreversible action, and the sandbox backends. The run core (``sessions.services``)
configures and calls it; nothing here calls back into Django.
"""
