"""Support for train.py and generate.py: their command-line plumbing (cli.py), the setup of a
training run (training.py) and the plot of its losses (loss_plot.py)."""
