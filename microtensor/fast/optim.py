"""The optimizers need no fast twins: their readable kernels (`sgd_update` and `adamw_update` in
microtensor/optim.py) are already what speed needs, one loop that reads and writes each element
once, which the compiler vectorizes as written because it holds no sum to reorder. (fastmath would
only let the compiler fuse multiplications and additions, which changes the last bit of an update.)
"""
