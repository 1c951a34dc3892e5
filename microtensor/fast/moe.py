"""The mixture-of-experts ops (microtensor/ops/moe.py) have no fast twins: gathering rows,
scatter-adding them and renormalizing k gates per token are memory traffic and a few additions,
which the readable loops already do at memory speed, while the layer's arithmetic is in the
experts' matrix products, which have their own twins (fast/matmul.py).
"""
