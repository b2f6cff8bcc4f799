"""The shared training loop and what it stands on: arguments, the Task contract, fit/run, the optimizer, checkpoints,
the output directory, process setup and exit, batching, GradCache, JSON files and user errors."""
