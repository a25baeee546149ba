"""Rollout side: the shared multi-LoRA vLLM server and AReaL engine subclasses."""
