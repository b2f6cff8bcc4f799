"""A trained model's settings, one JSON file beside its weights (reader_settings.json, retriever_settings.json), made
and read back by one mechanism for both models: `SettingsFile.from_configs` takes each setting from the run's
configs (the field of the same name) or from what the run measured, `save` writes it whole (the atomic writer),
`recorded` reads back the settings this version knows (a setting an older version wrote and this one no longer has
is left out). What a later run does with them is utils.runtime.flags's `filled` (a flag not given takes the
recorded value) or `as_recorded` (every recorded value, the flags' own not read)."""

import dataclasses
import json
import os
from typing import ClassVar

from utils.runtime.atomic import atomic_file


@dataclasses.dataclass
class SettingsFile:
    FILE: ClassVar[str]  # the file's name in a model's directory

    @classmethod
    def from_configs(cls, *configs, **values):
        """The settings of a run: each from `values` where given, else from the first of `configs` (dataclasses;
        None skipped) with a field of its name, else at its default."""
        taken = dict(values)
        for f in dataclasses.fields(cls):
            for config in configs:
                if f.name not in taken and config is not None and f.name in {g.name for g in
                                                                            dataclasses.fields(config)}:
                    taken[f.name] = getattr(config, f.name)
        return cls(**taken)

    def save(self, directory: str) -> None:
        with atomic_file(os.path.join(directory, self.FILE)) as f:
            json.dump(dataclasses.asdict(self), f, indent=1)

    @classmethod
    def recorded(cls, directory: str) -> tuple[dict, dict] | None:
        """(the settings this version knows, everything the file holds) of a model directory; None without the file.
        A file that is not a JSON object raises ValueError (each model says what that means for it)."""
        path = os.path.join(directory, cls.FILE)
        if not os.path.isfile(path):
            return None
        with open(path) as f:
            saved = json.load(f)
        if not isinstance(saved, dict):
            raise ValueError(f"{cls.FILE} holds no JSON object")
        return {f.name: saved[f.name] for f in dataclasses.fields(cls) if f.name in saved}, saved
