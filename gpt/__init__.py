"""A GPT built on microtensor's public API, in four rooms.

    model/        the transformer (model/transformer.py); model/electives/: MoE, LoRA, quantization
    generation/   one Decoder makes every next token; sampling; the one-token kernel;
                  generation/electives/: beam search, speculative decoding
    text/         the corpus, the character tokenizer and the batches; text/electives/: byte-level BPE
    checkpoints/  saving and loading a run; the PyTorch bridge (convert, torch_gpt)

A file directly in a room is one the default GPT runs; a file in a room's electives/ is a
technique the tutorials teach, switched on by a flag.
"""
