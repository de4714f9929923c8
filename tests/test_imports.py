"""The import graph of adaptive/ has no cycle: every `import` of the package's own modules (function-local ones
too; `if TYPE_CHECKING:` blocks excluded, they never run), read from the source. And no import of the project's own
modules hides inside a function (adaptive/ and the four CLIs) without a comment on its line saying why. And
docs/architecture.md's layer table places every module, with no import from a lower layer to a higher one."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from conftest import ROOT

PACKAGE = ROOT / "adaptive"
CLIS = ("train_accelerate.py", "sample.py", "evaluate_fid.py", "reconstruct_ema.py")


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path, modules: set[str]) -> set[str]:
    """The package modules `path` imports."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = set()

    def visit(node):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                continue
            if isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    parts = package.split(".")[: len(package.split(".")) - child.level + 1]
                    base = ".".join(parts + ([child.module] if child.module else []))
                found.update(f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in child.names)
            elif isinstance(child, ast.Import):
                found.update(a.name for a in child.names)
            visit(child)

    visit(ast.parse(path.read_text()))
    return {m for m in found if m in modules and m != name}


def cycles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def connect(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(component)

    for v in graph:
        if v not in index:
            connect(v)
    return out


def test_the_package_has_no_import_cycle():
    paths = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph = {name: imports(path, set(paths)) for name, path in paths.items()}
    assert "adaptive.timesteps.registry" in graph["adaptive.config.settings"]  # reads lazy ones
    found = cycles(graph)
    assert not found, f"import cycles: {found}"


def test_the_cycle_finder_finds_cycles():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [{"a", "b", "c"}]
    assert cycles({"a": {"b"}, "b": set()}) == []


def hidden_imports(path: Path) -> list[int]:
    """The line of each import of the project's own modules inside a function without a comment on its line."""
    lines = path.read_text().splitlines()
    found = []
    for fn in ast.walk(ast.parse("\n".join(lines))):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(fn):
            own = (isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("adaptive"))) \
                or (isinstance(node, ast.Import) and any(a.name.split(".")[0] == "adaptive" for a in node.names))
            if own and "#" not in lines[node.lineno - 1]:
                found.append(node.lineno)
    return sorted(set(found))


def test_no_function_local_import_of_the_project_without_a_reason():
    files = sorted(PACKAGE.rglob("*.py")) + [ROOT / name for name in CLIS]
    found = [f"{path.relative_to(ROOT)}:{line}" for path in files for line in hidden_imports(path)]
    assert not found, f"function-local imports of the project's own modules without a one-line reason: {found}"


def test_the_hidden_import_check_finds_one(tmp_path):
    (tmp_path / "m.py").write_text("def f():\n    from .hub import x\n    from adaptive import y  # why\n")
    assert hidden_imports(tmp_path / "m.py") == [2]


def documented_layers() -> dict[str, int]:
    """docs/architecture.md's layer table: module (`x.py`, or a package `x/`) -> its layer, 1 = the lowest row."""
    rows = [line for line in (ROOT / "docs" / "architecture.md").read_text().split("## The modules")[0].splitlines()
            if line.startswith("| ") and "`" in line]
    out: dict[str, int] = {}
    for i, row in enumerate(rows):
        for name in re.findall(r"`([\w/]+\.py|\w+/)`", row.split("|")[2]):
            out.setdefault(name, len(rows) - i)  # a row's first mention places a module (later ones are remarks)
    return out


def test_the_documented_layers_hold_every_module_and_no_import_goes_up():
    layers = documented_layers()
    paths = {module_name(p): p for p in PACKAGE.rglob("*.py")}

    def layer_of(module: str):
        rel = module.removeprefix("adaptive.")
        top = rel.split(".")[0]
        return layers.get(f"{top}/") if f"{top}/" in layers else layers.get(rel.replace(".", "/") + ".py")

    unplaced = sorted(m for m in paths if m != "adaptive" and layer_of(m) is None)
    assert not unplaced, f"modules missing from docs/architecture.md's layer table: {unplaced}"
    up = [f"{m} -> {d}" for m, p in paths.items() if m != "adaptive"
          for d in imports(p, set(paths)) if d.startswith("adaptive.") and layer_of(d) > layer_of(m)]
    assert not up, f"imports from a lower layer to a higher one (docs/architecture.md): {up}"
