"""The OpenAI-compatible HTTP server: protocol, scheduler, app, command line."""

DEFAULT_MAX_MODEL_LEN = 2048
"""KV slots per sequence when --max-model-len is not given (capped by the model's context)."""
