"""Code-edit prompts from Python's stdlib: pick small modules and plan one concrete edit per
file from its `ast` (rename a function, add a docstring, change a numeric constant)."""

from __future__ import annotations

import ast
import functools
import sysconfig
from dataclasses import dataclass
from pathlib import Path

# Source files must leave room for the instruction inside the workload's prompt bound.
MAX_SOURCE_CHARS = 4200


@dataclass(frozen=True)
class CodeEdit:
    kind: str  # "rename" | "docstring" | "constant"
    target: str  # an identifier defined in the source
    instruction: str


def _strip_header(source: str) -> str:
    """Drop the leading comment block (shebang, coding line, license)."""
    lines = source.splitlines()
    start = next((i for i, s in enumerate(lines) if s.strip() and not s.startswith("#")), 0)
    return "\n".join(lines[start:]) + "\n"


@functools.lru_cache(maxsize=1)
def stdlib_sources() -> tuple[tuple[str, str], ...]:
    """(relative path, stripped source) of stdlib modules small enough for a prompt."""
    root = Path(sysconfig.get_paths()["stdlib"])
    skip = ("test", "idle_test", "site-packages", "dist-packages", "lib2to3", "__pycache__")
    found = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if any(part.startswith(skip) for part in rel.parts):
            continue
        try:
            source = _strip_header(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError):
            continue
        if 40 <= source.count("\n") <= 160 and len(source) < MAX_SOURCE_CHARS:
            found.append((rel.as_posix(), source))
    return tuple(found)


FunctionNode = ast.FunctionDef | ast.AsyncFunctionDef


def _functions(tree: ast.Module) -> list[tuple[str, FunctionNode]]:
    """(label, node) for module-level functions and methods of module-level classes."""
    found = []
    for node in tree.body:
        if isinstance(node, FunctionNode):
            found.append((f"function `{node.name}`", node))
        elif isinstance(node, ast.ClassDef):
            found += [
                (f"method `{f.name}` of class `{node.name}`", f)
                for f in node.body
                if isinstance(f, FunctionNode)
            ]
    return found


def plan_edits(source: str) -> list[CodeEdit]:
    """Every concrete edit the ``ast`` of ``source`` supports, functions first."""
    tree = ast.parse(source)
    functions = _functions(tree)
    taken = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    taken |= {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    taken |= {fn.name for _, fn in functions}
    edits = []
    for label, fn in functions:
        new = f"{fn.name.strip('_')}_impl"
        if not fn.name.startswith("__") and new not in taken:
            edits.append(
                CodeEdit(
                    "rename",
                    fn.name,
                    f"Rename the {label} to `{new}` and update every reference to it.",
                )
            )
        if ast.get_docstring(fn) is None:
            edits.append(
                CodeEdit(
                    "docstring",
                    fn.name,
                    f"Add a one-line docstring to the {label} describing what it does.",
                )
            )
    return edits + _constant_edits(tree, functions)


def _number(node: ast.expr | None) -> int | float | None:
    value = node.value if isinstance(node, ast.Constant) else None
    return value if isinstance(value, int | float) and not isinstance(value, bool) else None


def _constant_edits(tree: ast.Module, functions: list[tuple[str, FunctionNode]]) -> list[CodeEdit]:
    """Change an UPPER_CASE numeric constant or a numeric parameter default."""
    found: list[tuple[str, str, int | float]] = []
    for node in ast.walk(tree):
        value = _number(node.value) if isinstance(node, ast.Assign) else None
        if isinstance(node, ast.Assign) and value is not None:
            found += [
                (f"constant `{t.id}`", t.id, value)
                for t in node.targets
                if isinstance(t, ast.Name) and t.id.isupper()
            ]
    for label, fn in functions:
        params = fn.args.posonlyargs + fn.args.args
        pairs = [
            *zip(params[len(params) - len(fn.args.defaults) :], fn.args.defaults, strict=True),
            *zip(fn.args.kwonlyargs, fn.args.kw_defaults, strict=True),
        ]
        found += [
            (f"default of parameter `{a.arg}` of the {label}", a.arg, v)
            for a, d in pairs
            if (v := _number(d)) is not None
        ]
    return [
        CodeEdit("constant", target, f"Change the {what} from {v} to {v * 2 + 1}.")
        for what, target, v in found
    ]
