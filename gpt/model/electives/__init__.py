"""Techniques that change the model: a mixture of experts, LoRA adapters, quantized weights."""
