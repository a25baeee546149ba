"""The run directory: its writer (atomic commits, JSONL logs) and its readers."""
