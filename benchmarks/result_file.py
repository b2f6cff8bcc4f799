"""Where a benchmark's numbers go: one JSON file in its --out folder, stamped with the machine they ran on."""

import json
import os
import platform


def write_result(out: str, name: str, result: dict, show: bool = True) -> None:
    """`result`, with "machine" (the CPU and its cores), as out/name; printed too where `show`."""
    result["machine"] = f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores"
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, name), "w") as f:
        json.dump(result, f, indent=1)
    if show:
        print(json.dumps(result, indent=1))
