"""What the tests share: helpers, fakes and launchers (no tests, no fixtures:
those live in the conftest files)."""
