"""The shape of the library: small modules, imports that go one way, kernels known only to
themselves and the registry, and an ``import stlib`` that does not load the estimator."""

from __future__ import annotations

import ast
import subprocess
import sys

from stlib import registry, sources

#: The house size of a module (lines).
MAX_LINES = 500
#: The only places that may name a kernel by string: the kernels themselves and the registry (its
#: default); the analysis, the entry points, routing, benchmarks and plots ask the registry.
KERNEL_OWNERS = ("kernels/", "registry.py")


def test_no_module_is_over_the_house_size():
    sizes = {
        p.relative_to(sources.ROOT.parent): len(p.read_text().splitlines())
        for p in sources.ROOT.rglob("*.py")
    }
    assert {p: n for p, n in sizes.items() if n > MAX_LINES} == {}


def test_imports_go_one_way_lazy_ones_included():
    assert sources.import_cycles() == []


def test_the_import_graph_reads_lazy_and_relative_imports(tmp_path):
    root = tmp_path / "stlib"
    (root / "pkg").mkdir(parents=True)
    (root / "__init__.py").write_text("from stlib import pkg\n")
    (root / "pkg" / "__init__.py").write_text("from .a import x\n")
    (root / "pkg" / "a.py").write_text("def f():\n    from stlib import b\n")
    (root / "b.py").write_text("import stlib.pkg.a\n")
    assert sources.module_imports("stlib.pkg", root) == {"stlib.pkg.a"}
    assert sources.module_imports("stlib.pkg.a", root) == {"stlib.b"}
    assert sources.import_cycles(root) == [["stlib.pkg.a", "stlib.b", "stlib.pkg.a"]]
    files = {p.relative_to(root).as_posix() for p in sources.module_sources(["stlib.b"], root)}
    assert files == {"__init__.py", "b.py", "pkg/__init__.py", "pkg/a.py"}


def test_no_kernel_is_named_by_string_outside_the_kernels():
    """No string literal (docstrings aside) equal to a registered implementation's name."""
    found = []
    for file in sorted(sources.ROOT.rglob("*.py")):
        if file.relative_to(sources.ROOT).as_posix().startswith(KERNEL_OWNERS):
            continue
        tree = ast.parse(file.read_text())
        docs = {
            id(node.body[0].value)
            for node in ast.walk(tree)
            if isinstance(node, (ast.Module, ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef))
            and node.body
            and isinstance(node.body[0], ast.Expr)
        }
        found += [
            f"{file.relative_to(sources.ROOT)}:{node.lineno}: {node.value!r}"
            for node in ast.walk(tree)
            if isinstance(node, ast.Constant)
            and node.value in registry.IMPLEMENTATIONS
            and id(node) not in docs
        ]
    assert found == []


#: Kernel modules still imported from outside ``stlib/kernels/`` (issue 34 left them): the case list
#: and the block sweep read the lane-dense kernel's block rules and VMEM model. The list must shrink to empty: an import added
#: anywhere else fails, and so does one listed here that is gone (strike it off).


def test_kernels_are_reached_through_the_registry():
    """No module outside ``stlib/kernels/`` imports a kernel's own module (``import stlib.kernels``,
    which registers them, is fine): the rest asks ``registry.by_role`` or ``registry.get``."""
    found = {}
    for file in sorted(sources.ROOT.rglob("*.py")):
        relative = file.relative_to(sources.ROOT.parent).with_suffix("")
        module = ".".join(relative.parts).removesuffix(".__init__")
        if module.startswith("stlib.kernels"):
            continue
        inside = {m for m in sources.module_imports(module) if m.startswith("stlib.kernels.")}
        if inside:
            found[module] = inside
    assert found == {}


def test_the_analysis_imports_nothing_of_the_benchmarks():
    found = {}
    for file in sorted((sources.ROOT / "analysis").rglob("*.py")):
        module = ".".join(file.relative_to(sources.ROOT.parent).with_suffix("").parts).removesuffix(
            ".__init__"
        )
        bench = {m for m in sources.module_imports(module) if m.startswith("stlib.bench")}
        if bench:
            found[module] = bench
    assert found == {}


def _private_imports(file) -> list[str]:
    """``from stlib.x import _name`` and ``module._name`` of an imported stlib module in ``file``
    (private modules such as ``stlib._intmath`` are the package's own and may be imported)."""
    tree = ast.parse(file.read_text())
    found, modules = [], set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("stlib"):
            for alias in node.names:
                package = sources.ROOT.parent / node.module.replace(".", "/")
                is_module = (package / f"{alias.name}.py").exists() or (package / alias.name).is_dir()
                if alias.name.startswith("_") and not alias.name.startswith("__") and not is_module:
                    found.append(f"{node.lineno}: from {node.module} import {alias.name}")
                elif is_module:
                    modules.add(alias.asname or alias.name)
        if isinstance(node, ast.Import):
            modules |= {a.asname or a.name.split(".")[0] for a in node.names if a.name.startswith("stlib")}
    found += [
        f"{node.lineno}: {node.value.id}.{node.attr}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and node.attr.startswith("_")
        and not node.attr.startswith("__")
        and isinstance(node.value, ast.Name)
        and node.value.id in modules
    ]
    return found


def test_no_private_name_is_used_across_modules():
    """What a module shares is public; a private name stays in its module (modules split by idea,
    not by size)."""
    found = {
        str(file.relative_to(sources.ROOT)): names
        for file in sorted(sources.ROOT.rglob("*.py"))
        if (names := _private_imports(file))
    }
    assert found == {}


def test_the_private_name_check_sees_both_forms(tmp_path):
    file = tmp_path / "m.py"
    file.write_text(
        "from stlib.kernels.tile import _forward\nfrom stlib import _intmath\n"
        "from stlib.kernels import mask_info\nmask_info._hidden\n_intmath.cdiv\n"
    )
    assert _private_imports(file) == ["1: from stlib.kernels.tile import _forward", "4: mask_info._hidden"]


def test_no_private_jax_import():
    """stlib calls JAX's public API only (``jax._src`` moves between releases without notice)."""
    found = []
    for file in sorted(sources.ROOT.rglob("*.py")):
        for node in ast.walk(ast.parse(file.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            found += [
                f"{file.relative_to(sources.ROOT)}:{node.lineno}" for n in names if n.startswith("jax._src")
            ]
    assert found == []


def test_import_stlib_loads_no_estimator_until_used():
    code = (
        "import sys, stlib; print(sorted(m for m in sys.modules if m.startswith('stlib.analysis'))); "
        "stlib.static_estimate; print('stlib.analysis.static' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["[]", "True"]


def test_the_import_graph_reads_safely_from_threads():
    """The estimator's tables key their compiles from a thread pool: reading the graph there too."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda _: sources.module_sources(["stlib.kernels.tile"]), range(32)))
    assert all(r == results[0] for r in results) and results[0]


def test_no_kernel_looks_up_the_chip_at_hand():
    """The chip a call is sized for is resolved once where the call is made (``Config.chip``, by
    ``Implementation.config``); nothing under ``stlib/kernels/`` names ``current_chip``."""
    found = []
    for file in sorted((sources.ROOT / "kernels").rglob("*.py")):
        for node in ast.walk(ast.parse(file.read_text())):
            if (isinstance(node, ast.Name) and node.id == "current_chip") or (
                isinstance(node, ast.alias) and node.name == "current_chip"
            ):
                found.append(f"{file.relative_to(sources.ROOT)}:{getattr(node, 'lineno', '?')}")
    assert found == []


def test_no_kernel_tests_a_mask_class():
    """Kernels read masks through the mask protocol (``form``, intervals, predicate, validity,
    ``order``, ``stacked``): no ``isinstance`` under ``stlib/kernels/`` names a ``stlib.masks``
    class, so a new wrapper mask needs no kernel edit."""
    from stlib import masks

    def subclasses(cls):
        return {cls} | {s for sub in cls.__subclasses__() for s in subclasses(sub)}

    mask_classes = {c.__name__ for c in subclasses(masks.Mask) if c.__module__.startswith("stlib.masks")}
    assert {"Mask", "PermutedMask", "StackedBlocks", "BandMask"} <= mask_classes
    found = []
    for file in sorted((sources.ROOT / "kernels").rglob("*.py")):
        for node in ast.walk(ast.parse(file.read_text())):
            if (
                isinstance(node, ast.Call)
                and getattr(node.func, "id", None) == "isinstance"
                and len(node.args) == 2
            ):
                named = {getattr(n, "id", None) or getattr(n, "attr", None) for n in ast.walk(node.args[1])}
                if named & mask_classes:
                    found.append(f"{file.relative_to(sources.ROOT)}:{node.lineno}")
    assert found == []


#: The most parameters a function under ``stlib/kernels/`` takes: past it, a call passes records
#: (``BackwardData``, ``PassSetup``, a ``KernelCall``, ``Folds``), not long argument lists.
MAX_KERNEL_PARAMETERS = 10


def test_no_kernel_function_takes_more_than_ten_parameters():
    found = []
    for file in sorted((sources.ROOT / "kernels").rglob("*.py")):
        for node in ast.walk(ast.parse(file.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                a = node.args
                count = len(a.posonlyargs) + len(a.args) + len(a.kwonlyargs) + bool(a.vararg) + bool(a.kwarg)
                if count > MAX_KERNEL_PARAMETERS:
                    found.append(f"{file.relative_to(sources.ROOT)}:{node.lineno} ({count})")
    assert found == []
