"""What a run reads, counted from the code: the project modules a pre-training and a fine-tuning run
import (the sets tests/test_main.py holds a run to), their lines split by Python's parser into code,
docstrings, comment lines and blank ones, and the longest chain of imports in src/ (every import,
those inside functions too). README links here instead of copying numbers that drift.

Example:
    python scripts/house_numbers.py
"""
import ast
import sys
from pathlib import Path

SOURCE = Path(__file__).resolve().parent.parent / "src"

# The project modules a run imports; tests/test_main.py checks that a run imports these and no others.
PRE_TRAINING_MODULES = frozenset({
    "architecture", "atomic", "batching", "checkpoints", "config", "cores", "cpu_kernels", "distributed", "errors",
    "hardware", "ini", "lm_data", "main", "masking", "mlm_task", "model", "optimizer", "packed_files", "run_log",
    "run_plan", "run_start", "shard_stream", "shards", "task", "throughput", "trainer", "vocab"})
FINE_TUNING_MODULES = PRE_TRAINING_MODULES - {"lm_data", "masking", "mlm_task", "packed_files", "shard_stream",
                                              "shards"} | {
    "classification_task", "fine_tuning", "glue_data", "glue_metrics", "glue_tasks", "pair_encoding"}


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
        for kind, count in line_kinds((SOURCE / f"{name}.py").read_text(encoding="utf-8")).items():
            totals[kind] = totals.get(kind, 0) + count
    return totals


def imports_of(path: Path, project: set[str]) -> set[str]:
    """The project modules a file imports anywhere in it."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
    return found & project


def longest_chain() -> list[str]:
    """The longest path of imports between src/'s modules (a circle would be endless: it is refused)."""
    project = {path.stem for path in SOURCE.glob("*.py")}
    graph = {name: imports_of(SOURCE / f"{name}.py", project) - {name} for name in project}
    longest: dict[str, list[str]] = {}

    def chain_from(name: str, seen: tuple[str, ...]) -> list[str]:
        if name in seen:
            raise SystemExit(f"error: src/ imports in a circle: {' -> '.join((*seen, name))}")
        if name not in longest:
            longest[name] = [name, *max((chain_from(each, (*seen, name)) for each in sorted(graph[name])),
                                        key=len, default=[])]
        return longest[name]
    return max((chain_from(name, ()) for name in sorted(project)), key=len)


def main():
    print("| run | modules | lines | code | docstrings | comment lines | blank |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for run, modules in (("pre-training (mlm)", PRE_TRAINING_MODULES), ("fine-tuning (sst2)", FINE_TUNING_MODULES)):
        totals = counted(modules)
        print(f"| {run} | " + " | ".join(f"{totals[kind]:,}" for kind in
                                        ("modules", "lines", "code", "docstrings", "comments", "blank")) + " |")
    chain = longest_chain()
    print(f"\nthe longest chain of imports in src/: {len(chain)} modules: {' -> '.join(chain)}")


if __name__ == "__main__":
    sys.exit(main())
