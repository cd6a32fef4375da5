"""Text in and out: tokenizers read from GGUF metadata, incremental
detokenizing, and chat templates with their sandbox and limits."""
