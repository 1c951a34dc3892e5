"""Support for train.py and generate.py: their command-line plumbing (cli.py) and the plot of a training run's losses (loss_plot.py)."""
