"""Teams: making them and saying who holds which role in each (an administrator's work)."""
