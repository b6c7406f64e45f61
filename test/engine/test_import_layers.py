"""The package's import structure: no import circles among its modules, and no lower layer importing
the process managers or the entry points. Read from the source with `ast`, so an import inside a
function or under TYPE_CHECKING counts as much as one at the top of a module.

A deferred import that a registry needs (a backend module loaded only when chosen) is exempt when it
sits in a function whose name contains "lazy" — that is how such an import is named."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Iterator, Optional

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = {"sglang": ROOT / "python" / "sglang", "sgl_kernel_ext": ROOT / "sgl_kernel_ext"}
LOWER_LAYERS = tuple(
    f"sglang.srt.{name}" for name in ("model_executor", "layers", "sampling", "mem_cache", "metrics")
) + ("sgl_kernel_ext",)
UPPER_LAYERS = ("sglang.srt.managers", "sglang.srt.entrypoints")


def module_files() -> dict[str, Path]:
    """Dotted module name -> its file, for every module of both packages."""
    modules = {}
    for package, folder in PACKAGES.items():
        for path in folder.rglob("*.py"):
            parts = (package, *path.relative_to(folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            modules[".".join(parts)] = path
    return modules


def _imported_names(node: ast.AST, module: str, is_package: bool) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    assert isinstance(node, ast.ImportFrom)
    base = node.module or ""
    if node.level:
        package = module if is_package else module.rpartition(".")[0]
        for _ in range(node.level - 1):
            package = package.rpartition(".")[0]
        base = f"{package}.{base}" if base else package
    return [base] + [f"{base}.{alias.name}" for alias in node.names]


def _imports(tree: ast.Module) -> Iterator[ast.AST]:
    """Every import statement, but those inside a function named *lazy*."""

    def visit(node: ast.AST, in_lazy: bool) -> Iterator[ast.AST]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)) and not in_lazy:
                yield child
            lazy = in_lazy or (isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) and "lazy" in child.name)
            yield from visit(child, lazy)

    yield from visit(tree, False)


def import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the package modules it imports (a name resolves to its longest module prefix)."""

    def resolve(name: str) -> Optional[str]:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        tree = ast.parse(path.read_text(), str(path))
        targets = set()
        for node in _imports(tree):
            for name in _imported_names(node, module, path.name == "__init__.py"):
                target = resolve(name)
                if target is not None and target != module:
                    targets.add(target)
        graph[module] = targets
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    cycles.append(sorted(component))
    return cycles


def upward_imports(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    return sorted(
        (module, target)
        for module, targets in graph.items()
        if module.startswith(LOWER_LAYERS)
        for target in targets
        if target.startswith(UPPER_LAYERS)
    )


def test_no_import_cycles():
    cycles = import_cycles(import_graph(module_files()))
    assert cycles == [], "import circles:\n" + "\n".join(" <-> ".join(c) for c in cycles)


def test_lower_layers_do_not_import_managers_or_entrypoints():
    assert upward_imports(import_graph(module_files())) == []


def test_checker_sees_cycles_and_upward_imports(tmp_path):
    """The checks fail where they must: a circle through a TYPE_CHECKING import, an upward import
    inside a function, and no circle through an exempt lazy registry import."""
    files = {
        "sglang/srt/layers/a.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from sglang.srt.layers.b import B\n",
        "sglang/srt/layers/b.py": "from sglang.srt.layers.a import *\ndef f():\n    from sglang.srt.managers.m import M\n",
        "sglang/srt/layers/c.py": "def _lazy_load():\n    from sglang.srt.layers.d import D\n",
        "sglang/srt/layers/d.py": "from sglang.srt.layers.c import C\n",
        "sglang/srt/managers/m.py": "",
    }
    modules = {}
    for rel, text in files.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        modules[rel[:-3].replace("/", ".")] = path
    graph = import_graph(modules)
    assert import_cycles(graph) == [["sglang.srt.layers.a", "sglang.srt.layers.b"]]
    assert upward_imports(graph) == [("sglang.srt.layers.b", "sglang.srt.managers.m")]
