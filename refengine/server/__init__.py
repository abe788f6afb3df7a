"""The SGLang-compatible HTTP server in front of the engine's ranks."""
