"""Support for train.py and generate.py: the plot of a training run's losses (loss_plot.py)."""
