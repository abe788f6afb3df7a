"""Backends: one object per server kind (our engine, SGLang, a recording) with declared capabilities.

Everything goes over HTTP (or the recording file); never imports torch, refengine or textual.
"""
