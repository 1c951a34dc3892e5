"""Checkpoints: saving and loading a run (checkpoint.py), and the bridge to PyTorch (convert.py, torch_gpt.py)."""
