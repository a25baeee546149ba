"""areal-marlaas: multi-tenant asynchronous RL fine-tuning (many LoRA tasks, one base
model, one multi-LoRA vLLM server, one FSDP trainer) as a plugin on top of AReaL."""

__version__ = "0.1.0"
