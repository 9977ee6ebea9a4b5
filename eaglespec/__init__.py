"""eaglespec: EAGLE speculative decoding with its own fast target runtime."""

__version__ = "0.1.0"
