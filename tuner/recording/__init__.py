"""Recordings: one SQLite file per session (schema, writer thread, reader). No textual, no torch."""
