"""Textual widgets of the TUI. They pull windows from the store; they own no measuring or state logic."""
