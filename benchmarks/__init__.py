"""The project's benchmarks (docs/benchmarks/README.md): each script runs by path or as a module,

    python benchmarks/compare_methods.py ...   ==   python -m benchmarks.compare_methods ...

and imports the project (`adaptive`) and its own library (`benchmarks.bench`, `benchmarks.drill`) as installed
packages (`pip install -e .`), with no sys.path edits. From a second worktree that shares the first one's virtual
environment (a benchmark pinned at a commit), run the module form in that worktree's root: Python then finds the
worktree's own `adaptive` and `benchmarks` first. `same_tree` refuses the mix (a script of one tree importing another
tree's code) with one line.
"""

from __future__ import annotations

import sys
from pathlib import Path


def same_tree(script: str) -> None:
    """Exit 2 with one line when the script `script` (its __file__) and the `adaptive` / `benchmarks` packages it
    imported come from different source trees."""
    import adaptive

    root = Path(script).resolve().parents[1]
    for name, module in (("adaptive", adaptive), ("benchmarks", sys.modules[__name__])):
        tree = Path(module.__file__).resolve().parents[1]
        if tree != root:
            print(f"{Path(script).name}: error: this script is in {root} but imports {name} from {tree}; run "
                  f"`python -m benchmarks.{Path(script).stem} ...` in {root}", file=sys.stderr)
            sys.exit(2)
