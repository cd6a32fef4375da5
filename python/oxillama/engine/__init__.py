"""The synchronous engine: one session on a loaded model (generation,
embeddings, speculative decoding) and the state a snapshot captures."""
