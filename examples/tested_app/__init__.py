"""A small shop's background tasks and their tests: sqlq.testing as a user uses it."""
