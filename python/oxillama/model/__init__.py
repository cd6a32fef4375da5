"""Model files: locating them (local paths, the default model, the hub),
loading a GGUF once per process, its fingerprint, offload budgets and LoRA
adapters."""
