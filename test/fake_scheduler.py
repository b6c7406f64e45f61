"""A model-free stand-in for run_scheduler_process, and a tiny tokenizer, for server tests.

The fake echoes each request's prompt ids cyclically, one token per step, and finishes on a
stop token, a stop string (matched on the decoded output), max_new_tokens, or an abort. Like
the real scheduler it sends every step of a streaming request and only the final state of
the others. It appends what it receives to the JSON-lines file named by FAKE_SCHEDULER_LOG,
so tests can check what reached the scheduler.

custom_params knobs: fake_abort (str: finish at once with that abort message), fake_delay
(seconds per step), fake_nan (true: the output logprobs are NaN).
"""

from __future__ import annotations

import json
import math
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Optional

import zmq

from sglang.srt.managers.io_struct import (
    AbortReq,
    BatchTokenOut,
    FlushCacheReq,
    GetLoadReq,
    SchedulerInput,
    SchedulerLoad,
    SchedulerReady,
    TokenizedGenerateReqInput,
    TokenOut,
    decoder,
    encode,
)
from sglang.srt.managers.results_channel import results_sender
from sglang.srt.server_args import PortArgs, ServerArgs

CONTEXT_LEN = 4096
LOG_ENV = "FAKE_SCHEDULER_LOG"
ENTRY = "fake_scheduler:run_fake_scheduler"

_SERVER_ERROR = {"status_code": 500, "err_type": "InternalServerError"}
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
EOS_ID = 2
_CORPUS = [
    "Hello world. The quick brown fox jumps over the lazy dog.",
    "A stop string ends the text; the server trims it unless no_stop_trim is set.",
    "Sampling with a seed gives the same tokens every time, on every server.",
] * 20


def build_test_tokenizer(folder: str) -> None:
    """A byte-level BPE (vocab ~400, specials 0..2) saved as an HF folder; loads in a blink.

    Bytes outside the corpus (emoji, accents) stay single-byte tokens, so a character can be
    split across tokens, which is what the detokenizer's hold-back logic must handle.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400, special_tokens=SPECIAL_TOKENS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(_CORPUS, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    fast.add_special_tokens({"additional_special_tokens": ["<|im_start|>"]})
    fast.save_pretrained(folder)


@dataclass
class _FakeReq:
    msg: TokenizedGenerateReqInput
    output_ids: list[int] = field(default_factory=list)
    pending: list[int] = field(default_factory=list)  # generated but not yet sent
    input_logprobs_sent: bool = False
    finished_reason: Optional[dict[str, Any]] = None
    matched_text: Optional[str] = None

    @property
    def params(self) -> dict[str, Any]:
        return self.msg.sampling_params

    @property
    def custom(self) -> dict[str, Any]:
        return self.params.get("custom_params") or {}


class FakeScheduler:
    def __init__(self, server_args: ServerArgs, port_args: PortArgs) -> None:
        from transformers import PreTrainedTokenizerFast  # without AutoTokenizer's torch import

        self.tokenizer = PreTrainedTokenizerFast.from_pretrained(server_args.tokenizer_path)
        self.vocab_size = len(self.tokenizer)
        self.model_path = server_args.model_path or ""
        ctx = zmq.Context()
        self.recv_sock = ctx.socket(zmq.PULL)
        self.recv_sock.bind(port_args.scheduler_input_ipc)
        self.send_sock = results_sender(server_args, port_args, ctx)
        self.decoder = decoder(SchedulerInput)
        self.running: dict[str, _FakeReq] = {}

    def ready_message(self) -> SchedulerReady:
        return SchedulerReady(
            vocab_size=self.vocab_size,
            context_len=CONTEXT_LEN,
            max_total_num_tokens=CONTEXT_LEN * 4,
            max_running_requests=16,
            eos_token_ids=[EOS_ID],
            model_path=self.model_path,
        )

    def event_loop(self) -> None:
        while True:
            timeout = 0 if self.running else None  # block only when idle
            while self.recv_sock.poll(timeout):
                self._handle(self.decoder.decode(self.recv_sock.recv()))
                timeout = 0
            self._step()

    def _handle(self, msg: Any) -> None:
        if isinstance(msg, AbortReq):
            _log({"kind": "abort", "rid": msg.rid})
            req = self.running.get(msg.rid)
            if req is not None:
                req.finished_reason = {"type": "abort", "message": "aborted", "status_code": 499, "err_type": "Abort"}
                self._send([req])
            return
        if isinstance(msg, FlushCacheReq):
            _log({"kind": "flush"})
            return
        if isinstance(msg, GetLoadReq):
            self.send_sock.send(encode(BatchTokenOut(outs=[], load=self._load(msg.req_id))))
            return
        _log({"kind": "req", **{f: getattr(msg, f) for f in msg.__struct_fields__}})
        self.running[msg.rid] = _FakeReq(msg)

    def _load(self, req_id: int) -> SchedulerLoad:
        """Live gauges as /get_server_info reports them: one slot and no KV per running request."""
        total, slots, running = CONTEXT_LEN * 4, 16, len(self.running)
        return SchedulerLoad(
            req_id=req_id, num_running_reqs=running, num_queue_reqs=0, req_slots_free=slots - running,
            req_slots_total=slots, max_total_num_tokens=total, num_free_tokens=total, num_evictable_tokens=0,
            num_used_tokens=0, token_usage=0.0, num_steps=0, num_failed_steps=0, step_time_buckets=[],
            step_time_counts=[], step_time_sum=0.0,
        )

    def _step(self) -> None:
        delay = max((float(r.custom.get("fake_delay", 0)) for r in self.running.values()), default=0.0)
        if delay:
            time.sleep(delay)  # stands in for the model's step time
        for req in list(self.running.values()):
            self._advance(req)
        self._send([r for r in self.running.values() if r.msg.stream or r.finished_reason is not None])

    def _advance(self, req: _FakeReq) -> None:
        if "fake_abort" in req.custom:
            req.finished_reason = {"type": "abort", "message": req.custom["fake_abort"], **_SERVER_ERROR}
            return
        max_new = req.params.get("max_new_tokens")
        max_new = 16 if max_new is None else max_new
        if max_new == 0:
            req.finished_reason = {"type": "length", "length": 0}
            return
        prompt = req.msg.input_ids
        token = prompt[len(req.output_ids) % len(prompt)]
        req.output_ids.append(token)
        req.pending.append(token)
        req.finished_reason = self._finish(req, token, max_new)

    def _finish(self, req: _FakeReq, token: int, max_new: int) -> Optional[dict[str, Any]]:
        if token in (req.params.get("stop_token_ids") or []):
            return {"type": "stop", "matched": token}
        stops = req.params.get("stop") or []
        text = self.tokenizer.decode(req.output_ids, skip_special_tokens=True)
        for stop in [stops] if isinstance(stops, str) else stops:
            if stop in text:
                req.matched_text = stop
                return {"type": "stop", "matched": stop}
        if len(req.output_ids) >= max_new:
            return {"type": "length", "length": max_new}
        return None

    def _send(self, reqs: list[_FakeReq]) -> None:
        if not reqs:
            return
        outs = [self._token_out(r) for r in reqs]
        for r in reqs:
            if r.finished_reason is not None:
                self.running.pop(r.msg.rid, None)
        self.send_sock.send(encode(BatchTokenOut(outs=outs)))

    def _token_out(self, req: _FakeReq) -> TokenOut:
        new_ids, req.pending = req.pending, []
        params, msg = req.params, req.msg
        out = TokenOut(
            rid=msg.rid,
            new_output_ids=new_ids,
            finished_reason=req.finished_reason,
            prompt_tokens=len(msg.input_ids),
            completion_tokens=len(req.output_ids),
            skip_special_tokens=params.get("skip_special_tokens", True),
            spaces_between_special_tokens=params.get("spaces_between_special_tokens", True),
            no_stop_trim=params.get("no_stop_trim", False),
            matched_text=req.matched_text,
        )
        if msg.stream and len(new_ids) == len(req.output_ids) and not out.no_stop_trim:  # the first output
            out.stop_strs = params.get("stop_strs")
        if msg.return_logprob:
            self._fill_logprobs(req, out, new_ids)
        return out

    def _fill_logprobs(self, req: _FakeReq, out: TokenOut, new_ids: list[int]) -> None:
        msg = req.msg
        lp = math.nan if req.custom.get("fake_nan") else -0.5
        out.output_token_logprobs = [[lp, t] for t in new_ids]
        if msg.top_logprobs_num:
            out.output_top_logprobs = [self._top(t, msg.top_logprobs_num) for t in new_ids]
        if msg.token_ids_logprob is not None:
            out.output_token_ids_logprobs = [[[-1.0, t] for t in msg.token_ids_logprob] for _ in new_ids]
        if not req.input_logprobs_sent:
            req.input_logprobs_sent = True
            self._fill_input_logprobs(msg, out)

    def _fill_input_logprobs(self, msg: TokenizedGenerateReqInput, out: TokenOut) -> None:
        start = len(msg.input_ids) if msg.logprob_start_len == -1 else msg.logprob_start_len
        positions = range(start, len(msg.input_ids))
        out.input_token_logprobs = [[None if p == 0 else -0.25, msg.input_ids[p]] for p in positions]
        if msg.top_logprobs_num:
            k = msg.top_logprobs_num
            out.input_top_logprobs = [None if p == 0 else self._top(msg.input_ids[p], k) for p in positions]
        if msg.token_ids_logprob is not None:
            out.input_token_ids_logprobs = [
                None if p == 0 else [[-1.0, t] for t in msg.token_ids_logprob] for p in positions
            ]

    def _top(self, token: int, k: int) -> list[list[Any]]:
        return [[-0.1 * j, (token + j) % self.vocab_size] for j in range(k)]


def _log(record: dict[str, Any]) -> None:
    path = os.environ.get(LOG_ENV)
    if path:
        with open(path, "a") as f:
            f.write(json.dumps(record) + "\n")


def run_fake_scheduler(server_args: ServerArgs, port_args: PortArgs, tp_rank: int, ready_writer: Any, dp_rank: int = 0) -> None:
    _log({"kind": "start", "rank": tp_rank, "pid": os.getpid()})
    if tp_rank != 0:
        threading.Event().wait()  # other ranks only exist, as processes to manage
    scheduler = FakeScheduler(server_args, port_args)
    ready_writer.send(encode(scheduler.ready_message()))
    scheduler.event_loop()
