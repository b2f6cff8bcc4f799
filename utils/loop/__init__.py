"""The shared training loop and what it stands on: the flags every script shares (args.py) and the configs the loop
takes (config.py), the Task contract, fit/run, the optimizer, checkpoints, the output directory, process setup and
exit, batching and GradCache. It knows no particular task."""
