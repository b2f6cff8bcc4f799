"""What qa_system.py prints: what the system ranks and reads with as it starts, and the table of its rows as it
ends (utils.system.measure makes the rows)."""


def announce(accelerator, system, bands: list[int], clamped: str | None, as_trained: bool) -> None:
    """What the system (a QASystem) ranks and reads with, and at which precision (`as_trained`: no precision was
    asked for, each model runs at its own)."""
    ranking = "hybrid with BM25" if system.hybrid else "dense" if system.index else "BM25"
    accelerator.print(f"qa: {len(system.passages)} passages, ranking {ranking}, k={bands}, answer rule "
                      f"{'question (shared normalization)' if system.shared_norm else 'window'}; precision "
                      + ", ".join(f"{part} {p}" for part, p in system.precisions.items())
                      + (" (as trained)" if as_trained else "")
                      + (f"\nqa: {clamped}" if clamped else ""))


def report(accelerator, rows: list[dict], ceiling: dict | None, left_out: str | None, last: str) -> None:
    """The table as the run ends: a line per k, the ceiling (or why it is left out), then `last`."""
    for row in rows:
        accelerator.print(_line(row))
    if ceiling or left_out:
        accelerator.print("gold paragraphs (the ceiling): " + (_line(ceiling) if ceiling else left_out))
    accelerator.print(last)


def _line(row: dict) -> str:
    return "  ".join(f"{key} {_fmt(value)}" for key, value in row.items())


def _fmt(value):
    if isinstance(value, dict):
        return "(" + ", ".join(f"{key} {_fmt(v)}" for key, v in value.items()) + ")"
    return f"{value:.2f}" if isinstance(value, float) else value
