"""Textual screens of the TUI (help, trace analysis, py-spy, tune)."""
