"""The shared training loop: its flags (args.py: TrainArgs) and the configs it takes (config.py), the Task contract,
a run's setup, fit/run, the optimizer, checkpoints and GradCache. It knows no particular task; the runtime it stands
on is utils/runtime."""
