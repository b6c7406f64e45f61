"""--log-requests / --log-requests-level: a 'Receive: obj=...' line when a request arrives and a
'Finish: obj=..., out=...' line when it ends, showing what SGLang's levels 0..3 show. The
formatting is checked directly; one real server (embedded SmolLM2) checks the wiring."""

from __future__ import annotations

import uuid

import pytest

from flag_helpers import post_ok, wait_until
from sglang.srt.managers.io_struct import GenerateReqInput
from sglang.srt.managers.request_logger import RequestLogger, truncated_repr
from sglang.srt.server_args import ServerArgs, prepare_server_args

pytestmark = pytest.mark.e2e

pytest_plugins = ["flag_servers"]  # one set of servers for the flag tests of a session

REQ = GenerateReqInput(text="hello world", sampling_params={"temperature": 0.5}, rid="r-1")
OUT = {"text": " and more", "output_ids": [11, 12], "meta_info": {"id": "r-1", "completion_tokens": 2}}


def _lines(level: int) -> tuple[str, str]:
    logger = RequestLogger(True, level)
    return logger.format_input(REQ), logger.format_output(OUT)


def test_level_0_shows_metadata_only() -> None:
    req, out = _lines(0)
    assert "rid='r-1'" in req and "stream=False" in req
    assert "hello" not in req and "temperature" not in req and "input_ids" not in req
    assert out == "{'meta_info': {'id': 'r-1', 'completion_tokens': 2}}"


def test_level_1_adds_the_sampling_params() -> None:
    req, out = _lines(1)
    assert "sampling_params={'temperature': 0.5}" in req and "rid='r-1'" in req
    assert "hello" not in req and "and more" not in out and "output_ids" not in out


def test_level_2_shows_inputs_and_outputs_cut_at_2048() -> None:
    req, out = _lines(2)
    assert "text='hello world'" in req and "sampling_params={'temperature': 0.5}" in req
    assert out == repr(OUT)  # short values are shown whole, exactly as repr would
    long_text = "a" * 1000 + "b" * 3000 + "c" * 1000
    logged = RequestLogger(True, 2).format_input(GenerateReqInput(text=long_text, rid="r-2"))
    assert f"text={'a' * 1000 + 'b' * 24!r} ... {'b' * 24 + 'c' * 1000!r}" in logged
    ids = list(range(5000))
    assert truncated_repr(ids, 2048) == repr(ids[:1024])[:-1] + ", ... " + repr(ids[-1024:])[1:]


def test_level_3_shows_everything_uncut() -> None:
    long_text = "x" * 5000
    logged = RequestLogger(True, 3).format_input(GenerateReqInput(text=long_text, rid="r-3"))
    assert f"text={long_text!r}" in logged


def test_what_is_not_logged() -> None:
    assert not RequestLogger(False).wants("r-1")
    assert RequestLogger(True).wants("r-1")
    assert not RequestLogger(True).wants("HEALTH_CHECK_abc")  # /health probes would flood the log
    with pytest.raises(ValueError, match="--log-requests-level must be one of 0, 1, 2, 3"):
        RequestLogger(True, 4)


def test_flags_parse_into_server_args(capsys) -> None:
    assert (ServerArgs().log_requests, ServerArgs().log_requests_level) == (False, 2)  # SGLang's defaults
    args = prepare_server_args(["--log-requests", "--log-requests-level", "0"])
    assert (args.log_requests, args.log_requests_level, args.ignored_flags) == (True, 0, [])
    with pytest.raises(SystemExit):
        prepare_server_args(["--log-requests-level", "4"])
    assert "--log-requests-level" in capsys.readouterr().err
    with pytest.raises(ValueError, match="--log-requests-level must be one of 0, 1, 2, 3, got 7"):
        ServerArgs(log_requests_level=7).validate()


def test_server_logs_a_request_with_its_rid_text_and_output(flag_servers) -> None:
    server = flag_servers["plain"]  # --log-requests at the default level 2
    rid = f"logged-{uuid.uuid4().hex}"
    text = "Tell me about logging"
    out = post_ok(server, "/generate", {"text": text, "rid": rid, "sampling_params": {"temperature": 0, "max_new_tokens": 4}})

    def line(kind: str) -> str:
        return next((ln for ln in server.output.splitlines() if f"{kind}: obj=" in ln and f"rid={rid!r}" in ln), "")

    received = wait_until(lambda: line("Receive"), what="the Receive line")
    assert f"text={text!r}" in received and "'max_new_tokens': 4" in received
    finished = wait_until(lambda: line("Finish"), what="the Finish line")
    assert f"text={text!r}" in finished
    assert f"out={{'text': {out['text']!r}, 'output_ids': {out['output_ids']!r}, 'meta_info': {{'id': {rid!r}" in finished
    assert not any("HEALTH_CHECK_" in ln for ln in server.output.splitlines() if "Receive: obj=" in ln)
