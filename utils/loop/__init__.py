"""The shared training loop: the configs it takes, which are its flags (config.py), the Task contract,
a run's setup, fit/run, the optimizer, checkpoints and GradCache. It knows no particular task; the runtime it stands
on is utils/runtime."""
