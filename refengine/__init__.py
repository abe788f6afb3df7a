"""The reference EAGLE-3 engine: plain-PyTorch models, tensor parallelism, speculative decoding,
and an SGLang-compatible HTTP server.

Must not import tuner or textual.
"""
