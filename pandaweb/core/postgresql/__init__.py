"""PostgreSQL with a pool that gets over connections the server closed (``base.py``)."""
