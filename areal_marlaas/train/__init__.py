"""Training side: the multi-LoRA FSDP engine and the multi-task trainer."""
