"""Decoding algorithms over the same Decoder: beam search and speculative decoding."""
