"""Techniques that change the model: a mixture of experts, LoRA adapters, quantized weights, and
the model split over simulated ranks (parallelism.py)."""
