"""Embedding has no fast twins: its readable kernels (microtensor/ops/embedding.py) are already as
fast as they need be, because a gather and a scatter-add are pure memory traffic, copied and added
row by row in loops the compiler vectorizes as written, with nothing a faster formula could save.
"""
