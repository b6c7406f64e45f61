"""The tokenizer manager reads its results from its event loop's reader callbacks, in both
--detokenizer-mode layouts: every message is read, also those sent before the reader was
registered and those after one whose handling raised (zmq's FD signals only new messages, so a
drain that stopped early would leave the rest unread until the next one arrived)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
import zmq

from sglang.srt.managers.io_struct import BatchStrOut, BatchTokenOut, SchedulerReady, StrOut, TokenOut, encode
from sglang.srt.managers.results_channel import results_sender
from sglang.srt.managers.tokenizer_manager import TokenizerManager
from sglang.srt.server_args import PortArgs, prepare_server_args


def _manager(detokenizer_mode: str) -> tuple[TokenizerManager, Callable[[bytes], None]]:
    """The tokenizer manager, and a send to it from where its results come from in that mode."""
    server_args = prepare_server_args(["--skip-tokenizer-init", "--detokenizer-mode", detokenizer_mode])
    server_args.resolve()
    port_args = PortArgs.init_new()
    ready = SchedulerReady(vocab_size=100, context_len=64, max_total_num_tokens=64, max_running_requests=1,
                           eos_token_ids=[0], model_path="m")
    tm = TokenizerManager(server_args, port_args, ready, None)
    if detokenizer_mode == "inline":  # scheduler rank 0's sender
        return tm, results_sender(server_args, port_args, zmq.Context.instance()).send
    detokenizer = zmq.Context.instance().socket(zmq.PUSH)  # the detokenizer process's
    detokenizer.setsockopt(zmq.LINGER, 0)
    detokenizer.connect(port_args.tokenizer_manager_ipc)
    return tm, detokenizer.send


def _message(detokenizer_mode: str, index: int) -> bytes:
    """What each mode's socket carries: the detokenizer's text, or the scheduler's token ids
    (which the other mode's decoder refuses)."""
    token = TokenOut(rid=f"r{index}", new_output_ids=[5], finished_reason=None, prompt_tokens=1, completion_tokens=1)
    batch = BatchTokenOut(outs=[token]) if detokenizer_mode == "inline" else BatchStrOut(outs=[StrOut(token, "x")])
    return encode(batch)


@pytest.mark.parametrize("detokenizer_mode", ["process", "inline"])
def test_every_message_is_read_after_one_that_raised(detokenizer_mode: str) -> None:
    tm, send = _manager(detokenizer_mode)
    handled: list[str] = []  # the rid each handled BatchStrOut carries

    async def run() -> None:
        done = asyncio.Event()

        def handle(batch: BatchStrOut) -> None:
            handled.append(batch.outs[0].token.rid)
            if len(handled) == 1:
                raise RuntimeError("the first message's handling fails")
            if len(handled) == 4:
                done.set()

        tm._handle_batch = handle
        send(_message(detokenizer_mode, 0))  # sent before the reader exists
        send(_message(detokenizer_mode, 1))
        tm._ensure_receiving()
        send(_message(detokenizer_mode, 2))
        send(_message(detokenizer_mode, 3))
        await asyncio.wait_for(done.wait(), timeout=30)

    try:
        asyncio.run(run())
    finally:
        tm.close()
    assert handled == ["r0", "r1", "r2", "r3"]
