"""Another tokenizer: byte-level BPE."""
