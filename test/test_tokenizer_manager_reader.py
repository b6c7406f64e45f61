"""The tokenizer manager reads the detokenizer's socket from its event loop's reader callback:
every message is read, also those queued before the reader was registered and those after one
whose handling raised (zmq's FD signals only new messages, so a drain that stopped early would
leave the rest unread until the next one arrived)."""

from __future__ import annotations

import asyncio

import zmq

from sglang.srt.managers.io_struct import BatchStrOut, SchedulerReady, encode
from sglang.srt.managers.tokenizer_manager import TokenizerManager
from sglang.srt.server_args import PortArgs, prepare_server_args


def _manager() -> tuple[TokenizerManager, PortArgs]:
    server_args = prepare_server_args(["--skip-tokenizer-init"])
    server_args.resolve()
    port_args = PortArgs.init_new()
    ready = SchedulerReady(vocab_size=100, context_len=64, max_total_num_tokens=64, max_running_requests=1,
                           eos_token_ids=[0], model_path="m")
    return TokenizerManager(server_args, port_args, ready, None), port_args


def test_every_message_is_read_after_one_that_raised():
    tm, port_args = _manager()
    context = zmq.Context()
    push = context.socket(zmq.PUSH)
    push.connect(port_args.tokenizer_manager_ipc)
    handled: list[int] = []

    async def run() -> None:
        done = asyncio.Event()

        def handle(batch: BatchStrOut) -> None:
            handled.append(len(handled))
            if len(handled) == 1:
                raise RuntimeError("the first message's handling fails")
            if len(handled) == 4:
                done.set()

        tm._handle_batch = handle
        push.send(encode(BatchStrOut(outs=[])))  # sent before the reader exists
        push.send(encode(BatchStrOut(outs=[])))
        tm._ensure_receiving()
        push.send(encode(BatchStrOut(outs=[])))
        push.send(encode(BatchStrOut(outs=[])))
        await asyncio.wait_for(done.wait(), timeout=30)

    try:
        asyncio.run(run())
    finally:
        push.close(linger=0)
        context.term()
        tm.close()
    assert handled == [0, 1, 2, 3]
