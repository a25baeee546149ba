"""Reading run directories back: phase times, per-task tables."""
