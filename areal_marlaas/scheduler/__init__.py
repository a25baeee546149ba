"""Scheduling: the pure core and the runtime that drives it."""
