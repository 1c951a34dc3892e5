"""Generation: one Decoder makes every next token; sampling and the one-token kernel beside it."""
