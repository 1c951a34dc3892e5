"""Models built on microtensor: a character-level GPT, its data and its checkpoints."""
