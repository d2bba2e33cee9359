"""The import graph of stlib's own modules, read from their sources (never by importing them):
what a module imports inside stlib, at module level or inside functions, and everything it reaches.
The estimate cache keys on the sources a kernel reaches; the architecture test reads the graph for
cycles."""

from __future__ import annotations

import ast
import os
import threading
from pathlib import Path

#: The stlib package directory.
ROOT = Path(__file__).resolve().parent
#: ``ast.parse`` from several threads at once can fail in CPython 3.11 ("AST constructor recursion
#: depth mismatch"); the estimator's tables key their compiles from a thread pool.
_PARSE = threading.Lock()
#: (path, mtime, size) -> the file's import statements (``_imported_names``), guarded by ``_PARSE``.
_PARSED: dict[tuple[str, int, int], tuple] = {}


def module_file(module: str, root: Path = ROOT) -> Path | None:
    """The source of an stlib module (``stlib.a.b``: ``a/b.py`` or ``a/b/__init__.py``), if any."""
    parts = module.split(".")[1:]
    for path in (
        root.joinpath(*parts).with_suffix(".py") if parts else None,
        root.joinpath(*parts, "__init__.py"),
    ):
        if path is not None and path.is_file():
            return path
    return None


def _imported_names(path: Path) -> tuple[tuple[str, int, tuple[str, ...]], ...]:
    """The import statements of one source file as (module, level, names): ``import a.b`` is
    ("a.b", 0, ()), ``from ..x import y`` ("x", 2, ("y",)). Parsed once per version of the file
    (its size and modification time): the estimate cache hashes a kernel's sources on every lookup."""
    stat = path.stat()
    key = (str(path), stat.st_mtime_ns, stat.st_size)
    with _PARSE:
        if key not in _PARSED:
            found = []
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Import):
                    found += [(alias.name, 0, ()) for alias in node.names]
                elif isinstance(node, ast.ImportFrom):
                    found.append((node.module or "", node.level, tuple(a.name for a in node.names)))
            _PARSED[key] = tuple(found)
        return _PARSED[key]


def module_imports(module: str, root: Path = ROOT) -> set[str]:
    """The stlib modules ``module`` imports, at module level or inside functions: ``from pkg import
    name`` counts as the submodule ``pkg.name`` where there is one, else as ``pkg`` itself."""
    path = module_file(module, root)
    if path is None:
        return set()
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for base, level, names in _imported_names(path):
        if not level and not names:  # import a.b
            found.add(base)
            continue
        if level:
            parts = package.split(".")
            anchor = parts[: len(parts) - level + 1]
            base = ".".join([*anchor, base] if base else anchor)
        for name in names:
            sub = f"{base}.{name}"
            found.add(sub if module_file(sub, root) is not None else base)
    return {name for name in found if name == "stlib" or name.startswith("stlib.")}


def all_modules(root: Path = ROOT) -> list[str]:
    """Every module of the stlib package (packages by their ``__init__``)."""
    names = []
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        parts = parts[:-1] if parts[-1] == "__init__" else parts
        names.append(".".join(("stlib", *parts)))
    return names


#: (modules, root) -> (``_stamp`` of the files reached and of the package's folders, those files):
#: the estimate cache asks for a kernel's sources on every lookup, and walking the graph costs
#: about 14 ms; a folder's stamp changes when a file appears in it, a file's when it is edited.
_REACHED: dict[tuple, tuple[tuple, frozenset]] = {}


def _stamp(paths) -> tuple:
    """(path, modification time, size) of each of ``paths``, sorted."""
    out = []
    for path in sorted(paths):
        stat = path.stat()
        out.append((str(path), stat.st_mtime_ns, stat.st_size))
    return tuple(out)


def module_sources(modules, root: Path = ROOT) -> set[Path]:
    """Every source file the stlib ``modules`` import, transitively (lazy imports included): each
    module reached, plus the ``__init__`` of the packages above it as files only (their own imports
    are followed only where a name is imported from the package itself). Remembered per process
    while no file reached is edited and no file is added to or removed from the package."""
    key = (tuple(modules), str(root))
    folders = _folders(root)
    known = _REACHED.get(key)
    if known is not None:
        try:
            if _stamp([*known[1], *folders]) == known[0]:
                return set(known[1])
        except FileNotFoundError:  # a file reached was removed: walk again
            pass
    files = _walk_sources(modules, root)
    _REACHED[key] = (_stamp([*files, *folders]), frozenset(files))
    return files


def _folders(root: Path) -> list[Path]:
    """The package's folders (``__pycache__`` left out)."""
    out = []
    for path, names, _ in os.walk(root):
        names[:] = [n for n in names if n != "__pycache__"]
        out.append(Path(path))
    return out


def _walk_sources(modules, root: Path) -> set[Path]:
    seen: set[str] = set()
    files: set[Path] = set()
    todo = list(modules)
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        path = module_file(module, root)
        if path is None:
            continue
        files.add(path)
        parts = module.split(".")
        files |= {p for i in range(1, len(parts)) if (p := module_file(".".join(parts[:i]), root))}
        todo += sorted(module_imports(module, root) - seen)
    return files


def import_cycles(root: Path = ROOT) -> list[list[str]]:
    """The cycles of the import graph (each as the modules on it, first repeated last); [] when
    imports go one way only."""
    graph = {m: sorted(module_imports(m, root)) for m in all_modules(root)}
    cycles, state = [], {}

    def visit(module, stack):
        state[module] = "open"
        stack.append(module)
        for nxt in graph.get(module, ()):
            if state.get(nxt) == "open":
                cycles.append([*stack[stack.index(nxt) :], nxt])
            elif nxt not in state:
                visit(nxt, stack)
        stack.pop()
        state[module] = "done"

    for module in graph:
        if module not in state:
            visit(module, [])
    return cycles


__all__ = ["ROOT", "all_modules", "import_cycles", "module_file", "module_imports", "module_sources"]
