"""Probe scripts run by `eaglespec interop` INSIDE each consumer's own virtual environment.

Each file is a standalone script (it imports the consumer, never eaglespec, which is not installed there):
it reads a JSON request file, loads our exported head with the consumer's own loader, runs it and writes
one JSON result (plus tensors where the comparison needs them). See docs/INTEROP.md.
"""
