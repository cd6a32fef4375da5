"""Choosing tokens: sampler configuration, grammars and JSON Schema, beam
search, logprobs, n-gram drafts and tool-call formats. Nothing here runs a
model; the engine drives these."""
