"""Errors the plugin raises on bad input."""


class ConfigError(ValueError):
    """A configuration problem, with the field and the fix in its message."""
