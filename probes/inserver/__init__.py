"""Probes loaded inside server processes (SGLang's scheduler, our engine's ranks).

Only torch and the standard library (prometheus_client where a server already has it).
"""
