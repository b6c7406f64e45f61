"""DetokenizerManager: token ids -> incremental text, with stop trimming.

Scheduler --BatchTokenOut--> here --BatchStrOut--> TokenizerManager, in a process of its own
(--detokenizer-mode process) or called by the TokenizerManager on what it receives (inline).
Each request's text is decoded incrementally over a short window of ids (enough context for
tokenizers whose decoding of a token depends on its neighbours), and text ending in U+FFFD, an
incomplete UTF-8 sequence split across tokens, is held back until the sequence completes.
"""

from __future__ import annotations

import logging
import signal
from dataclasses import dataclass, field
from typing import Any, NoReturn

import msgspec
import zmq

from sglang.srt.managers.io_struct import BatchStrOut, BatchTokenOut, StrOut, TokenOut, decoder, encode
from sglang.srt.server_args import PortArgs, ServerArgs
from sglang.srt.utils.hf_transformers_utils import get_tokenizer

logger = logging.getLogger(__name__)

_REPLACEMENT_CHAR = "\ufffd"
DETOKENIZATION_ERROR = "DetokenizationError"


@dataclass
class _DecodeState:
    ids: list[int] = field(default_factory=list)
    # ids[prefix_offset:read_offset] is already-emitted context re-decoded with the new ids.
    prefix_offset: int = 0
    read_offset: int = 0
    sent: str = ""  # the text emitted so far


class TextDecoder:
    """tokenizer.decode with HF's spaces_between_special_tokens semantics, which fast
    tokenizers ignore: added tokens are their own segments, joined to the text by spaces."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self._added_ids = frozenset(tokenizer.added_tokens_decoder)
        self._special_ids = frozenset(tokenizer.all_special_ids)

    def decode(self, ids: list[int], skip_special_tokens: bool, spaces_between_special_tokens: bool) -> str:
        skip = skip_special_tokens
        if not spaces_between_special_tokens or self._added_ids.isdisjoint(ids):
            return self.tokenizer.decode(ids, skip_special_tokens=skip)
        parts: list[str] = []
        run: list[int] = []
        for token_id in ids:
            if token_id not in self._added_ids:
                run.append(token_id)
                continue
            if skip and token_id in self._special_ids:
                continue
            if run:
                parts.append(self.tokenizer.decode(run, skip_special_tokens=skip))
                run = []
            parts.append(self.tokenizer.decode([token_id], skip_special_tokens=skip))
        if run:
            parts.append(self.tokenizer.decode(run, skip_special_tokens=skip))
        return " ".join(p for p in parts if p)


def trims_stop_text(out: TokenOut) -> bool:
    """Whether this final message's text is cut at a matched stop string or regex match."""
    reason = out.finished_reason or {}
    return reason.get("type") == "stop" and bool(out.matched_text) and not out.no_stop_trim


def cut_at_last(text: str, matched: str) -> str:
    cut = text.rfind(matched)
    return text if cut < 0 else text[:cut]


class DetokenizerManager:
    def __init__(self, tokenizer: Any) -> None:
        # None with --skip-tokenizer-init: results pass through with no text.
        self.decoder = TextDecoder(tokenizer) if tokenizer is not None else None
        self._states: dict[str, _DecodeState] = {}

    def handle(self, batch: BatchTokenOut) -> BatchStrOut:
        outs = [StrOut(token=out, new_text=self._safe_new_text(out)) for out in batch.outs]
        return BatchStrOut(outs=outs, load=batch.load)

    def _safe_new_text(self, out: TokenOut) -> str:
        if self.decoder is None:
            return ""
        try:
            return self._new_text(out)
        except Exception as err:  # one request's bad ids must not take the process down
            logger.exception("Detokenization failed for request %s", out.rid)
            # The request fails alone; the tokenizer manager tells the scheduler to stop it.
            out.finished_reason = {
                "type": "abort", "message": f"Detokenization failed: {type(err).__name__}: {err}",
                "status_code": 500, "err_type": DETOKENIZATION_ERROR,
            }
            return ""
        finally:
            if out.finished_reason is not None:
                self._states.pop(out.rid, None)

    def _new_text(self, out: TokenOut) -> str:
        state = self._states.setdefault(out.rid, _DecodeState())
        state.ids.extend(out.new_output_ids)
        finished = out.finished_reason is not None
        end = len(state.ids) - 1 if finished and _ends_with_stop_token(out) else len(state.ids)
        prefix = self._decode(state.ids[state.prefix_offset : state.read_offset], out)
        full = self._decode(state.ids[state.prefix_offset : end], out)
        new_text = full[len(prefix) :]
        if not finished and (not new_text or new_text.endswith(_REPLACEMENT_CHAR)):
            return ""  # wait for the rest of a split character
        state.prefix_offset, state.read_offset = state.read_offset, end
        if finished and trims_stop_text(out):
            # Text already sent cannot be taken back: when the stop text began there, nothing
            # is added (the tokenizer manager re-decodes such streams).
            new_text = cut_at_last(state.sent + new_text, out.matched_text)[len(state.sent) :]
        state.sent += new_text
        return new_text

    def _decode(self, ids: list[int], out: TokenOut) -> str:
        return self.decoder.decode(ids, out.skip_special_tokens, out.spaces_between_special_tokens)


def _ends_with_stop_token(out: TokenOut) -> bool:
    """A stop token (EOS or stop_token_ids) is kept in output_ids but not in the text."""
    reason = out.finished_reason or {}
    matched = reason.get("matched")
    return (
        reason.get("type") == "stop"
        and isinstance(matched, int)
        and not isinstance(matched, bool)
        and not out.no_stop_trim
        and bool(out.new_output_ids)
        and out.new_output_ids[-1] == matched
    )


def _exit_on_sigterm(signum: int, frame: Any) -> NoReturn:
    raise SystemExit(0)


def run_detokenizer_process(server_args: ServerArgs, port_args: PortArgs) -> None:
    """Process entry: PULL BatchTokenOut at detokenizer_ipc, PUSH BatchStrOut to the tokenizer manager."""
    logging.basicConfig(level=server_args.log_level.upper(), format="[detokenizer] %(levelname)s %(message)s")
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the launcher owns Ctrl-C and sends SIGTERM
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    context = zmq.Context()
    recv_sock = context.socket(zmq.PULL)
    recv_sock.bind(port_args.detokenizer_ipc)
    send_sock = context.socket(zmq.PUSH)
    send_sock.connect(port_args.tokenizer_manager_ipc)
    try:
        tokenizer = None if server_args.skip_tokenizer_init else get_tokenizer(server_args.tokenizer_path, server_args.trust_remote_code)
        manager = DetokenizerManager(tokenizer)
        batch_decoder = decoder(BatchTokenOut)
        while True:
            frame = recv_sock.recv()
            try:
                batch = batch_decoder.decode(frame)
            except msgspec.DecodeError:  # msgpack of our structs only: anything else is dropped, never run
                logger.error("Dropping an undecodable %d-byte message on the detokenizer socket", len(frame))
                continue
            send_sock.send(encode(manager.handle(batch)))
    finally:
        context.destroy(linger=0)
