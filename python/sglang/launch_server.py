"""`python -m sglang.launch_server [flags]`: start the HTTP server (flags: --help)."""

from __future__ import annotations

import sys
from typing import Optional

from sglang.srt.server_args import prepare_server_args


def main(argv: Optional[list[str]] = None) -> None:
    server_args = prepare_server_args(argv)
    try:
        server_args.resolve()
    except (ValueError, FileNotFoundError) as err:
        sys.exit(f"error: {err}")
    # Imported here: spawned children re-import this module, and need none of the HTTP stack.
    from sglang.srt.entrypoints.launch import LaunchError
    from sglang.srt.entrypoints.serve import launch_server

    try:
        launch_server(server_args)
    except LaunchError as err:
        sys.exit(f"error: {err}")


if __name__ == "__main__":
    main()
