"""Text in, batches out: the corpus, the character tokenizer, the train/val split."""
