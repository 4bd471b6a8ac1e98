"""Example jobs (the demo job lives here so tests and the demo share one definition)."""
