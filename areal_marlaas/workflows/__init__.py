"""AReaL rollout workflows that route each task to its own adapter."""
