"""SGLang-style serving engine: `python -m sglang.launch_server`, or `sglang.Engine` in-process."""


def __getattr__(name: str):
    # Lazy: `import sglang` (e.g. by the spawned children) must not pull in the HTTP stack.
    if name == "Engine":
        from sglang.srt.entrypoints.engine import Engine

        return Engine
    raise AttributeError(f"module 'sglang' has no attribute {name!r}")
