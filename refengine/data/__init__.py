"""Shipped data: the tiny model's weights, its tokenizer description, held-out prompts, corpus list.

Paths only; must not import torch or load anything. The tiny model is the default of `serve` and of
the demo: target checkpoint in TINY_TARGET_DIR, its EAGLE-3 head in TINY_DRAFT_DIR (both in the
Hugging Face / EAGLE-3 checkpoint layouts the engine loads for real models).
"""

from pathlib import Path

TINY_DIR = Path(__file__).resolve().parent / "tiny"
TINY_TARGET_DIR = TINY_DIR / "target"
TINY_DRAFT_DIR = TINY_DIR / "eagle3"
TINY_PROMPTS = TINY_DIR / "heldout_prompts.jsonl"
TINY_CORPUS_LIST = TINY_DIR / "corpus_files.txt"
