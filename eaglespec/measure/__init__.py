"""Measurement: benchmark records, reports, acceptance diagnosis."""
