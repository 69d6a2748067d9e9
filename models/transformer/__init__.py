"""Transformer attention benchmarks: one attention layer's training memory (`attention_memory`)."""
