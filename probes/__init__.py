"""Measuring: NVML, server metrics parsing, trace capture and analysis, py-spy, in-server probes.

Imports nothing at package level, so `probes.inserver` can load inside a server process cheaply.
Must not import textual or tuner.
"""
