"""The OpenAI-compatible HTTP server: protocol, scheduler, app."""
