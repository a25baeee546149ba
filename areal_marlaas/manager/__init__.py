"""Per-task state, data cursors and the run directory (atomic commits)."""
