"""Regenerate python/sglang/srt/sglang_flags.py (SGLang's launch flags, by --help group) from an
installed SGLang release, and the flag table of docs/serving.md from it.

    python scripts/gen_sglang_flags.py --sglang-root DIR

DIR holds SGLang's `sglang` package (a site-packages folder, e.g. a venv's after
`pip install --no-deps sglang==X`, or an unpacked source tree). It is read in a subprocess
of its own, since this repository's package is also called `sglang`; SGLang's dependencies
that are not installed are replaced by empty stand-ins (only the argparse parser is built).
Names of the previous table that the release no longer has stay parsed, in a group of their
own, so launch commands written for older releases keep running.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
TABLE = ROOT / "python" / "sglang" / "srt" / "sglang_flags.py"
DOC = ROOT / "docs" / "serving.md"
OLDER_GROUP = "older releases"
DOC_BEGIN, DOC_END = "<!-- sglang-flags:begin -->", "<!-- sglang-flags:end -->"

# Run inside the subprocess: build SGLang's parser and print its flags as JSON.
_READER = r'''
import argparse, importlib.abc, importlib.machinery, json, sys, types

STUBS = set()


def _stub_type(name):
    class Meta(type):
        def __getattr__(cls, attr):
            if attr.startswith("__"):
                raise AttributeError(attr)
            return _stub_type(attr)

        def __getitem__(cls, key):
            return cls

        def __or__(cls, other):
            return cls

        __ror__ = __or__

    return Meta(name, (), {"__init__": lambda self, *a, **k: None, "__call__": lambda self, *a, **k: None})


class StubModule(types.ModuleType):
    __path__ = []

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _stub_type(name)


class StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] not in STUBS:
            return None
        return importlib.machinery.ModuleSpec(name, self, is_package=True)

    def create_module(self, spec):
        return StubModule(spec.name)

    def exec_module(self, module):
        pass


sys.path.insert(0, sys.argv[1])
sys.meta_path.insert(0, StubFinder())
for _ in range(200):
    try:
        import sglang.srt.server_args as sa
        break
    except ModuleNotFoundError as err:
        top = (err.name or "").split(".")[0]
        if not top or top == "sglang" or top in STUBS:
            raise
        STUBS.add(top)
        for name in [m for m in sys.modules if m == "sglang" or m.startswith("sglang.")]:
            del sys.modules[name]
parser = argparse.ArgumentParser()
sa.ServerArgs.add_cli_args(parser)
namespaces = getattr(sa, "_namespaces", {})
flags = []
for action in parser._actions:
    if not action.option_strings or isinstance(action, argparse._HelpAction):
        continue
    nargs = action.nargs
    flags.append({
        "names": list(action.option_strings),
        "switch": nargs == 0,
        "nargs": nargs if nargs != 0 else None,
        "group": namespaces.get(action.dest, "server"),
    })
print(json.dumps({"version": getattr(__import__("sglang.version").version, "__version__", "?"), "flags": flags}))
'''


def read_release(sglang_root: str) -> tuple[str, list[dict[str, Any]]]:
    """(version, flags) of the SGLang release under `sglang_root`."""
    out = subprocess.run(
        [sys.executable, "-c", _READER, sglang_root], cwd="/", check=True, capture_output=True, text=True
    ).stdout
    data = json.loads(out.strip().splitlines()[-1])
    return data["version"], data["flags"]


def previous_table() -> list[tuple[tuple[str, ...], bool, Any, str]]:
    spec = importlib.util.spec_from_file_location("_previous_sglang_flags", TABLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return [(tuple(e[0]), e[1], e[2], e[3] if len(e) > 3 else OLDER_GROUP) for e in module.SGLANG_FLAGS]


def merged(flags: list[dict[str, Any]]) -> list[tuple[tuple[str, ...], bool, Any, str]]:
    """The release's flags in its order, then the previous table's names it no longer has."""
    rows = [(tuple(f["names"]), f["switch"], f["nargs"], f["group"]) for f in flags]
    known = {name for names, *_ in rows for name in names}
    for names, switch, nargs, _ in previous_table():
        missing = tuple(n for n in names if n not in known)
        if missing:
            rows.append((missing, switch, nargs, OLDER_GROUP))
            known.update(missing)
    return rows


def render_table(version: str, rows: list[tuple[tuple[str, ...], bool, Any, str]]) -> str:
    lines = [
        f'"""The launch flags of SGLang {version} (its ServerArgs.add_cli_args, {len(rows)} entries with those of',
        "older releases it dropped): (option strings, whether it is a switch, nargs as argparse takes it,",
        "SGLang's namespace, the --help group). Data only, generated by scripts/gen_sglang_flags.py; what",
        'is done with them is in server_args_compat.py."""',
        "",
        f'SGLANG_VERSION = "{version}"',
        "",
        "SGLANG_FLAGS: tuple[tuple[tuple[str, ...], bool, object, str], ...] = (",
    ]
    lines += [f"    ({names!r}, {switch!r}, {nargs!r}, {group!r})," for names, switch, nargs, group in rows]
    lines.append(")")
    return "\n".join(lines) + "\n"


def render_doc_table() -> str:
    """docs/serving.md's table: per SGLang namespace, its flags this server implements (as ours or
    as another name of ours) and those it accepts without effect (read from the parser)."""
    from sglang.srt.server_args import ServerArgs
    from sglang.srt.sglang_flags import SGLANG_FLAGS, SGLANG_VERSION

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    ours = set(parser._option_string_actions)
    by_group: dict[str, tuple[list[str], list[str]]] = {}
    for names, _, _, group in SGLANG_FLAGS:
        implemented, ignored = by_group.setdefault(group, ([], []))
        (implemented if ours.intersection(names) else ignored).append(names[0])
    lines = [
        f"SGLang {SGLANG_VERSION}'s flags (and older releases' names) by SGLang's namespace:",
        "",
        "| namespace | implemented | accepted without effect (start-up warning) |",
        "|---|---|---|",
    ]
    for group, (implemented, ignored) in by_group.items():
        lines.append(f"| {group} | {' '.join(f'`{n}`' for n in implemented)} | {' '.join(f'`{n}`' for n in ignored)} |")
    return "\n".join(lines)


def write_doc(table: str) -> None:
    text = DOC.read_text()
    start, end = text.index(DOC_BEGIN) + len(DOC_BEGIN), text.index(DOC_END)
    DOC.write_text(text[:start] + "\n" + table + "\n" + text[end:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sglang-root", help="folder holding SGLang's sglang package; skip to only redo the doc")
    args = parser.parse_args()
    if args.sglang_root:
        version, flags = read_release(args.sglang_root)
        TABLE.write_text(render_table(version, merged(flags)))
        print(f"{TABLE}: SGLang {version}, {len(flags)} flags")
    # The doc is rendered by a fresh interpreter so that it reads the table just written.
    doc = subprocess.run(
        [sys.executable, "-c", "import sys; sys.path[:0] = sys.argv[1:]; import gen_sglang_flags as g; print(g.render_doc_table())",
         str(ROOT / "scripts"), str(ROOT / "python")],
        check=True, capture_output=True, text=True,
    ).stdout
    write_doc(doc.rstrip("\n"))
    print(f"{DOC}: flag table rewritten")


if __name__ == "__main__":
    main()
