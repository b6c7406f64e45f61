"""The scheduler's per-step message of a request (managers/result_processor._token_out) and the
stop-token check: the fields a request did not ask for stay None, and those it asked for carry
what was computed since its last message (an empty list when nothing was)."""

from __future__ import annotations

from sglang.srt.layers.sampling_report import ReportAsk, RowReport
from sglang.srt.managers.result_processor import _token_out
from sglang.srt.managers.schedule_batch import Req
from sglang.srt.model_executor.step import LogprobRequest
from sglang.srt.sampling.sampling_params import SamplingParams

LOGPROB_FIELDS = ("output_token_logprobs", "output_top_logprobs", "output_token_ids_logprobs", "input_token_logprobs",
                  "input_top_logprobs", "input_token_ids_logprobs")
REPORT_FIELDS = ("output_token_sampling_mask", "output_token_sampling_logprobs", "output_token_entropy_val")


def _req(**params) -> Req:
    return Req("r", [5, 6, 7], SamplingParams(**params), eos_token_ids={2})


def test_a_plain_request_sends_its_new_ids_and_nothing_it_did_not_ask_for():
    req = _req()
    req.output_ids += [9, 10]
    out = _token_out(req)
    assert (out.new_output_ids, out.prompt_tokens, out.completion_tokens) == ([9, 10], 3, 2)
    assert all(getattr(out, name) is None for name in LOGPROB_FIELDS + REPORT_FIELDS)
    req.output_ids.append(11)
    assert _token_out(req).new_output_ids == [11]


def test_asked_logprobs_are_taken_once_and_an_empty_step_sends_empty_lists():
    req = _req()
    req.logprob = LogprobRequest(top_logprobs_num=1)
    req.output_ids.append(9)
    req.pending_logprobs.output_token.append([-0.5, 9])
    req.pending_logprobs.output_top.append([[-0.5, 9]])
    first = _token_out(req)
    assert first.output_token_logprobs == [[-0.5, 9]] and first.output_top_logprobs == [[[-0.5, 9]]]
    assert first.output_token_ids_logprobs is None  # not asked
    again = _token_out(req)
    assert again.output_token_logprobs == [] and again.output_top_logprobs == []


def test_asked_reports_are_taken_once():
    req = _req()
    req.sampling_report = ReportAsk(entropy=True)
    req.output_ids.append(9)
    req.pending_report.add(RowReport(None, None, 1.25))
    out = _token_out(req)
    assert out.output_token_entropy_val == [1.25] and out.output_token_sampling_mask is None
    assert _token_out(req).output_token_entropy_val == []


def test_ignore_eos_ignores_eos_only():
    for ignore_eos, ends_at_eos in ((False, True), (True, False)):
        req = _req(ignore_eos=ignore_eos, stop_token_ids={4})
        req.output_ids.append(2)
        req.check_finished()
        assert req.finished() == ends_at_eos
        req.output_ids.append(4)
        req.check_finished()
        assert req.finished_reason["matched"] == (2 if ends_at_eos else 4)
