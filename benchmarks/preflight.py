"""Preflight: import every third-party module that the training scripts and the GPU check import, and print its
version, so that a machine that lacks one fails in seconds with the whole list instead of minutes into a run.

    python benchmarks/preflight.py          # exit status 0, or 1 with the missing modules and who imports them

The list is read from the code itself (every `import` in train_reader.py, train_dpr.py, utils/ and the GPU check,
and the module-level ones of the helpers it uses), so it cannot fall behind it. Imports guarded by `except
ImportError` are optional (the packaged MiniLM, say) and only reported. The project's own modules are then
imported too, which catches an installed package of the wrong version.
"""

import ast
import importlib
import importlib.metadata
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENTRY_POINTS = ("train_reader", "train_dpr")


# The GPU check also imports these helper modules, but calls only some of their functions: their module-level
# imports are required, the imports inside their functions (the MiniLM fixture, say) are not.
HELPERS = ("benchmarks/amp_benchmark.py", "tests/conftest.py")


def sources() -> list[str]:
    files = [os.path.join(ROOT, f) for f in ("train_reader.py", "train_dpr.py", "benchmarks/gpu_check.py", *HELPERS)]
    for folder, _, names in os.walk(os.path.join(ROOT, "utils")):
        files += [os.path.join(folder, n) for n in sorted(names) if n.endswith(".py")]
    return files


def _guarded(node, parents) -> bool:
    """Whether an import sits in a `try` whose handlers catch ImportError (an optional dependency)."""
    for parent in parents.get(node, ()):
        if isinstance(parent, ast.Try) and any(
                h.type is not None and "ImportError" in ast.unparse(h.type) for h in parent.handlers):
            return True
    return False


def third_party_imports() -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    """(required, optional): top-level module name -> the files (relative) that import it."""
    local = {"utils", "benchmarks", "tests", "conftest", "amp_benchmark", "gpu_check", "preflight", *ENTRY_POINTS}
    required, optional = {}, {}
    for path in sources():
        tree = ast.parse(open(path, encoding="utf-8").read())
        parents = {}
        for parent in ast.walk(tree):  # every node's enclosing nodes, innermost last
            for child in ast.iter_child_nodes(parent):
                parents[child] = parents.get(parent, []) + [parent]
        helper = os.path.relpath(path, ROOT) in HELPERS
        for node in (tree.body if helper else ast.walk(tree)):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top in sys.stdlib_module_names or top in local:
                    continue
                where = optional if _guarded(node, parents) else required
                where.setdefault(top, []).append(os.path.relpath(path, ROOT))
    for name in required:
        optional.pop(name, None)
    return required, optional


def version(module: str) -> str:
    distributions = importlib.metadata.packages_distributions().get(module, [module])
    for dist in distributions:
        try:
            return f"{dist} {importlib.metadata.version(dist)}"
        except importlib.metadata.PackageNotFoundError:
            continue
    return f"{module} (version unknown)"


def preflight() -> tuple[list[str], list[str]]:
    """(lines to print, problems): every required module imported, then the scripts' own modules."""
    required, optional = third_party_imports()
    lines, problems = [f"python {sys.version.split()[0]} ({sys.executable})"], []
    for name in sorted(required, key=str.lower):
        try:
            importlib.import_module(name)
            lines.append(f"  {version(name)}")
        except Exception as err:  # noqa: BLE001 - an import can fail in many ways; each is a finding
            problems.append(f"{name} (imported by {', '.join(sorted(set(required[name])))}): "
                            f"{type(err).__name__}: {err}")
    for name in sorted(optional):
        try:
            importlib.import_module(name)
            lines.append(f"  {version(name)} (optional)")
        except ImportError:
            lines.append(f"  {name}: not installed (optional, used by {', '.join(sorted(set(optional[name])))})")
    if not problems:  # only then: a missing module would fail these imports again, less clearly
        sys.path.insert(0, ROOT)
        for module in ENTRY_POINTS:
            try:
                importlib.import_module(module)
            except Exception as err:  # noqa: BLE001
                problems.append(f"{module}.py does not import: {type(err).__name__}: {err}")
    return lines, problems


def main() -> int:
    lines, problems = preflight()
    print("preflight:\n" + "\n".join(lines), flush=True)
    if problems:
        print("preflight FAILED, missing or broken:\n  " + "\n  ".join(problems)
              + "\ncarry the missing packages as wheels: docs/GPU_CHECK.md", file=sys.stderr, flush=True)
        return 1
    print("preflight: every module imports", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
