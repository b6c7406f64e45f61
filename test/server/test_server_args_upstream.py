"""Port of SGLang's test/srt/test_server_args.py (class TestPrepareServerArgs): an SGLang launch
command line parses, and a flag's value is kept on the parsed ServerArgs.

Upstream's TestPrepareServerArgs passes --json-model-override-args, a flag this server accepts
without effect. Not ported: TestLoadBalanceMethod (data parallelism and PD disaggregation),
TestHiCacheArgsNormalization (hierarchical cache) and TestPortArgs (the ZMQ/NCCL port layout of
SGLang's data-parallel attention): unit tests of SGLang internals for features not served here.
"""

from __future__ import annotations

import json

from sglang.srt.server_args import prepare_server_args

OVERRIDE = {"rope_scaling": {"factor": 2.0, "rope_type": "linear"}}


def _args():
    return prepare_server_args(["--model-path", "model_path", "--json-model-override-args", json.dumps(OVERRIDE)])


def test_prepare_server_args_parses() -> None:
    assert _args().model_path == "model_path"


def test_prepare_server_args_keeps_the_value() -> None:
    assert json.loads(_args().json_model_override_args) == OVERRIDE
