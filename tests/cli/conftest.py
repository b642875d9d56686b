"""Fixtures shared by the CLI's integration tests (the testbed's are in tests/conftest.py)."""
