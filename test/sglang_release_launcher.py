"""Run a module of an installed SGLang release (`python sglang_release_launcher.py MODULE ARGS...`)
in an interpreter that lacks some of its dependencies: a top-level module that is not installed
is replaced by an empty stand-in, so the release's client code (bench_serving) imports without
its GPU runtime's packages. Used by test_sglang_bench_serving.py."""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import runpy
import sys
import types

STUBS: set[str] = set()


def _stub_type(name: str) -> type:
    class Meta(type):
        def __getattr__(cls, attr: str):
            if attr.startswith("__"):
                raise AttributeError(attr)
            return _stub_type(attr)

        def __getitem__(cls, key):
            return cls

        def __or__(cls, other):
            return cls

        __ror__ = __or__

    return Meta(name, (), {"__init__": lambda self, *a, **k: None, "__call__": lambda self, *a, **k: None})


class _StubModule(types.ModuleType):
    __path__: list[str] = []

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return _stub_type(name)


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] not in STUBS:
            return None
        return importlib.machinery.ModuleSpec(name, self, is_package=True)

    def create_module(self, spec):
        return _StubModule(spec.name)

    def exec_module(self, module) -> None:
        pass


def import_with_stubs(module: str) -> None:
    """Import `module`, stubbing each missing top-level dependency it reaches."""
    sys.meta_path.insert(0, _StubFinder())
    for _ in range(200):
        try:
            importlib.import_module(module)
            return
        except ModuleNotFoundError as err:
            top = (err.name or "").split(".")[0]
            if not top or top == "sglang" or top in STUBS:
                raise
            STUBS.add(top)
            for name in [m for m in sys.modules if m == "sglang" or m.startswith("sglang.")]:
                del sys.modules[name]


if __name__ == "__main__":
    target, sys.argv = sys.argv[1], [sys.argv[1], *sys.argv[2:]]
    import_with_stubs(target)
    runpy.run_module(target, run_name="__main__", alter_sys=True)
