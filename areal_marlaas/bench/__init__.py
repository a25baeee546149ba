"""Benchmark commands: they print a table and write JSON (and plots)."""
