"""Tests of the reference engine (refengine/, without its HTTP server)."""
