"""SGLang's launch flags that this server accepts without effect, and the parser that takes them.

An SGLang user's launch command must start this server unchanged. Every flag of SGLang's
ServerArgs (sglang_flags.py: the newest release's and the names older ones had) that is not one
of ours (server_args.py) parses here, listed by --help under SGLang's namespace of it; the ones a
command passed are listed in one start-up warning. A flag that is neither ours nor SGLang's is
still an error, naming the closest real flag.
"""

from __future__ import annotations

import argparse
import difflib
import functools
from typing import NamedTuple, Optional, Union

from sglang.srt.sglang_flags import SGLANG_FLAGS

COMPAT_GROUP = "SGLang flags accepted without effect"  # the --help groups' title prefix
_PREFIX = "sglang_compat__"


class FlagSpec(NamedTuple):
    """One SGLang flag as it parses: a switch, or a flag taking values (nargs as argparse's; None = one)."""

    names: tuple[str, ...]
    switch: bool
    nargs: Optional[Union[str, int]]
    group: str  # SGLang's namespace of the flag (its --help group here)


def compat_specs(ours: set[str]) -> list[FlagSpec]:
    """SGLang's flags none of whose option strings is ours."""
    return [FlagSpec(tuple(names), switch, nargs, group) for names, switch, nargs, group in SGLANG_FLAGS
            if not ours.intersection(names)]


def group_title(namespace: str) -> str:
    return f"{COMPAT_GROUP}: {namespace}"


def add_compat_args(parser: argparse.ArgumentParser) -> None:
    """Add SGLang's other flags to `parser` (after ours): SGLang's other names of our flags (e.g.
    --tensor-parallel-size for --tp-size) as aliases, then the rest, each parsing as SGLang's does."""
    ours = dict(parser._option_string_actions)
    for names, *_ in SGLANG_FLAGS:
        known = [ours[name] for name in names if name in ours]
        missing = [name for name in names if name not in ours]
        if known and missing:
            _add_alias(parser, known[0], missing)
    groups: dict[str, argparse._ArgumentGroup] = {}
    for spec in compat_specs(set(ours)):
        if spec.group not in groups:
            groups[spec.group] = parser.add_argument_group(
                group_title(spec.group), "Parsed so that SGLang launch commands run unchanged; ignored here, "
                "with a start-up warning."
            )
        _add_ignored(groups[spec.group], spec)


def _add_ignored(group: argparse._ArgumentGroup, spec: FlagSpec) -> None:
    dest = _PREFIX + _field_name(spec.names[0])
    if spec.switch:
        group.add_argument(*spec.names, dest=dest, action="store_const", const=True, default=None)
    elif spec.nargs == "?":  # given bare, it takes const: not None, so it counts as passed
        group.add_argument(*spec.names, dest=dest, nargs="?", const="", default=None, metavar="V")
    else:
        group.add_argument(*spec.names, dest=dest, nargs=spec.nargs, default=None, metavar="V")


def _add_alias(parser: argparse.ArgumentParser, action: argparse.Action, names: list[str]) -> None:
    """`names` as more option strings of our `action` (same destination, same parsing)."""
    kwargs = dict(dest=action.dest, default=argparse.SUPPRESS, help=f"SGLang's name of {action.option_strings[0]}.")
    if action.nargs == 0:  # a switch
        parser.add_argument(*names, action="store_const", const=action.const, **kwargs)
    else:
        parser.add_argument(*names, type=action.type, nargs=action.nargs, choices=action.choices, **kwargs)


@functools.cache
def compat_fields() -> dict[str, bool]:
    """SGLang's field name of each flag accepted without effect -> whether it is a switch (ServerArgs
    consults it only for names that are not its own fields)."""
    return {_field_name(names[0]): switch for names, switch, *_ in SGLANG_FLAGS}


def _field_name(flag: str) -> str:
    return flag.lstrip("-").replace("-", "_")


def ignored_values(args: argparse.Namespace) -> dict[str, object]:
    """The accepted-without-effect flags a command passed, by SGLang's field name."""
    return {dest[len(_PREFIX) :]: value for dest, value in vars(args).items() if dest.startswith(_PREFIX) and value is not None}


def ignored_flags(args: argparse.Namespace, parser: argparse.ArgumentParser) -> list[str]:
    """The accepted-without-effect flags a command passed (their first option string)."""
    by_dest = {action.dest: action.option_strings[0] for action in parser._actions if action.dest.startswith(_PREFIX)}
    return sorted(by_dest[dest] for dest, value in vars(args).items() if dest in by_dest and value is not None)


def parse_args(parser: argparse.ArgumentParser, argv: Optional[list[str]]) -> argparse.Namespace:
    """parser.parse_args, except that an unknown flag's error names the closest real flag."""
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        parser.error(unknown_flag_message(unknown, list(parser._option_string_actions)))
    return args


def unknown_flag_message(unknown: list[str], known: list[str]) -> str:
    flag = next((u.split("=", 1)[0] for u in unknown if u.startswith("-")), unknown[0])
    close = difflib.get_close_matches(flag, known, n=1, cutoff=0.6)
    hint = f"; did you mean {close[0]}?" if close else ""
    return f"unrecognized argument {flag!r}{hint} (python -m sglang.launch_server --help lists every flag)"
