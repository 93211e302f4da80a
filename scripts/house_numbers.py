"""What a run reads and how the house stands, counted from the code: the project modules a pre-training
and a fine-tuning run import (the sets tests/test_main.py holds a run to), their lines split by Python's
parser into code, docstrings, comment lines and blank ones; the core (src/*.py) and its wings (the
folders of src/), with every import from the core into a wing (main.py alone may: it composes a run);
and the longest chain of imports in src/ (every import, those inside functions too). README links
here instead of copying numbers that drift.

Example:
    python scripts/house_numbers.py
"""
import ast
import sys
from pathlib import Path

SOURCE = Path(__file__).resolve().parent.parent / "src"
COMPOSER = "main"  # the one core module that imports the wings: it picks a run's task

# The project modules a run imports; tests/test_main.py checks that a run imports these and no others.
PRE_TRAINING_MODULES = frozenset({
    "architecture", "atomic", "batching", "checkpoints", "config", "cores", "cpu_kernels", "distributed", "errors",
    "hardware", "ini", "main", "masking", "model", "optimizer", "packed_files", "run_log", "run_plan",
    "run_start", "shard_stream", "shards", "task", "trainer", "vocab", "tasks", "tasks.lm_data", "tasks.mlm_task"})
FINE_TUNING_MODULES = PRE_TRAINING_MODULES - {"masking", "packed_files", "shard_stream", "shards", "tasks.lm_data",
                                              "tasks.mlm_task"} | {
    "tasks.classification_task", "tasks.fine_tuning", "tasks.glue_data", "tasks.glue_metrics", "tasks.glue_tasks",
    "tasks.pair_encoding"}


def module_path(name: str) -> Path:
    """The file of a project module: core.py, wing/module.py, or a wing's own wing/__init__.py."""
    path = SOURCE.joinpath(*name.split("."))
    return path / "__init__.py" if path.is_dir() else path.with_suffix(".py")


def project_modules() -> set[str]:
    return {".".join(path.relative_to(SOURCE).with_suffix("").parts).removesuffix(".__init__")
            for path in SOURCE.rglob("*.py")}


def wing_of(name: str) -> str | None:
    """The wing a module stands in, or None for the core."""
    return name.split(".")[0] if "." in name or (SOURCE / name).is_dir() else None


def line_kinds(text: str) -> dict[str, int]:
    """lines, and of them blank, comment (a line that is a comment alone), docstring and code."""
    lines = text.splitlines()
    blank = sum(not line.strip() for line in lines)
    comments = sum(line.strip().startswith("#") for line in lines)
    docstrings = sum(node.body[0].end_lineno - node.body[0].lineno + 1 for node in ast.walk(ast.parse(text))
                     if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                     and node.body and isinstance(node.body[0], ast.Expr)
                     and isinstance(node.body[0].value, ast.Constant) and isinstance(node.body[0].value.value, str))
    return {"lines": len(lines), "code": len(lines) - blank - comments - docstrings, "docstrings": docstrings,
            "comments": comments, "blank": blank}


def counted(modules: frozenset[str]) -> dict[str, int]:
    totals = {"modules": len(modules)}
    for name in modules:
        for kind, count in line_kinds(module_path(name).read_text(encoding="utf-8")).items():
            totals[kind] = totals.get(kind, 0) + count
    return totals


def imports_of(name: str, project: set[str]) -> set[str]:
    """The project modules a module imports anywhere in it: `from tasks import glue_data` is tasks.glue_data."""
    found = set()
    for node in ast.walk(ast.parse(module_path(name).read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            named = {f"{node.module}.{alias.name}" for alias in node.names}
            found |= (named & project) | ({node.module} if named - project else set())
    return (found & project) - {name}


def import_graph() -> dict[str, set[str]]:
    project = project_modules()
    return {name: imports_of(name, project) for name in project}


def core_imports_of_wings() -> list[str]:
    """'core -> wing.module' for each import from the core into a wing but main.py's: the house's one rule."""
    return sorted(f"{name} -> {each}" for name, imported in import_graph().items()
                  if wing_of(name) is None and name != COMPOSER for each in imported if wing_of(each))


def longest_chain() -> list[str]:
    """The longest path of imports between src/'s modules (a circle would be endless: it is refused)."""
    graph = import_graph()
    longest: dict[str, list[str]] = {}

    def chain_from(name: str, seen: tuple[str, ...]) -> list[str]:
        if name in seen:
            raise SystemExit(f"error: src/ imports in a circle: {' -> '.join((*seen, name))}")
        if name not in longest:
            longest[name] = [name, *max((chain_from(each, (*seen, name)) for each in sorted(graph[name])),
                                        key=len, default=[])]
        return longest[name]
    return max((chain_from(name, ()) for name in sorted(graph)), key=len)


def house() -> dict[str, dict[str, int]]:
    """Files and lines of the core and of each wing."""
    rooms: dict[str, dict[str, int]] = {}
    for name in project_modules():
        room = rooms.setdefault(wing_of(name) or "core", {"files": 0, "lines": 0})
        room["files"] += 1
        room["lines"] += len(module_path(name).read_text(encoding="utf-8").splitlines())
    return rooms


def main():
    print("| run | modules | lines | code | docstrings | comment lines | blank |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for run, modules in (("pre-training (mlm)", PRE_TRAINING_MODULES), ("fine-tuning (sst2)", FINE_TUNING_MODULES)):
        totals = counted(modules)
        print(f"| {run} | " + " | ".join(f"{totals[kind]:,}" for kind in
                                        ("modules", "lines", "code", "docstrings", "comments", "blank")) + " |")
    print("\n| room | files | lines |\n|---|---:|---:|")
    for room, size in sorted(house().items(), key=lambda item: (item[0] != "core", item[0])):
        print(f"| {'src/*.py (the core)' if room == 'core' else f'src/{room}/'} | {size['files']} | "
              f"{size['lines']:,} |")
    crossings = core_imports_of_wings()
    print(f"\nimports from the core into a wing (but {COMPOSER}.py's): {len(crossings)}"
          + "".join(f"\n  {each}" for each in crossings))
    chain = longest_chain()
    print(f"\nthe longest chain of imports in src/: {len(chain)} modules: {' -> '.join(chain)}")


if __name__ == "__main__":
    sys.exit(main())
