"""The target runtime: model, KV cache, loading and weight formats."""
