"""Shipped data: the tiny model's weights, its tokenizer description, held-out prompts, corpus list."""
