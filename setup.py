from setuptools import find_packages, setup

setup(
    name="sglang-sampling-engine",
    version="0.1.0",
    description="SGLang-style LLM serving engine built around its sampling subsystem",
    python_requires=">=3.10",
    package_dir={"sglang": "python/sglang", "sgl_kernel_ext": "sgl_kernel_ext"},
    packages=["sglang", "sgl_kernel_ext"]
    + ["sglang." + p for p in find_packages("python/sglang")]
    + ["sgl_kernel_ext." + p for p in find_packages("sgl_kernel_ext")],
    # The CPU kernels' C sources, compiled on first use (sgl_kernel_ext/cpu_build.py).
    package_data={"sgl_kernel_ext": ["*/*.c"]},
    install_requires=[
        "torch",
        "numpy",
        "dill",
        "orjson",
        "fastapi",
        "uvicorn",
        # uvicorn takes them when present: its C event loop and HTTP parser cost less CPU per
        # streamed token than asyncio's loop and h11 (the CPU server shares its cores with them).
        "uvloop; sys_platform != 'win32'",
        "httptools",
        "pyzmq",
        "msgspec",
        "requests",
        "gguf",
        "safetensors",
        "transformers",
        "tokenizers",
        "jinja2",
        # Grammar backends (--grammar-backend xgrammar | llguidance).
        "xgrammar",
        "llguidance",
        # /metrics (--enable-metrics).
        "prometheus-client",
    ],
    extras_require={
        "test": ["pytest", "psutil", "hypothesis", "scipy", "openai", "accelerate", "triton==3.9.0", "jsonschema", "sglang-router>=0.3.2", "schemathesis"],
        "bench": ["tqdm", "matplotlib"],
        # SGLang's Rust load balancer in front of several servers (docs/scaling.md).
        "router": ["sglang-router>=0.3.2"],
        "gpu": ["flashinfer-python", "triton"],
    },
)
