"""Shared core of train_reader.py and train_dpr.py: arguments, data, models, metrics, the one training loop."""
