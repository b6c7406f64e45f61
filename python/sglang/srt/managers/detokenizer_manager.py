"""DetokenizerManager: token ids -> incremental text, and the one owner of stop-text trimming.

Scheduler --BatchTokenOut--> here --BatchStrOut--> TokenizerManager, in a process of its own
(--detokenizer-mode process) or called by the TokenizerManager on what it receives (inline).
Each request's text is decoded incrementally over a short window of ids (enough context for
tokenizers whose decoding of a token depends on its neighbours), and text ending in U+FFFD, an
incomplete UTF-8 sequence split across tokens, is held back until the sequence completes.
The scheduler detects stops (it must end generation); the text is trimmed here: a streamed
request's tail that may be the start of a stop string is held back, so no chunk shows text the
final trim removes, and the final text is cut at the last match of the matched stop text.
"""

from __future__ import annotations

import logging
import signal
from dataclasses import dataclass, field
from collections.abc import Callable
from typing import Any, NoReturn

import msgspec
import zmq

from sglang.srt.managers.io_struct import BatchStrOut, BatchTokenOut, StrOut, TokenOut, decoder, encode
from sglang.srt.managers.results_router import detokenizer_endpoints, worker_endpoints
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
    held: str = ""  # decoded but not emitted: a tail that may be the start of a stop string
    stops: list[str] = field(default_factory=list)  # the stop strings whose starts are held back


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
        return BatchStrOut(outs=[self._safe_str_out(out) for out in batch.outs], load=batch.load)

    def _safe_str_out(self, out: TokenOut) -> StrOut:
        if self.decoder is None:
            return StrOut(token=out, new_text="")
        try:
            if out.beam_results:
                self._decode_beams(out)
            return self._str_out(out)
        except Exception as err:  # one request's bad ids must not take the process down
            logger.exception("Detokenization failed for request %s", out.rid)
            # The request fails alone; the tokenizer manager tells the scheduler to stop it.
            out.finished_reason = {
                "type": "abort", "message": f"Detokenization failed: {type(err).__name__}: {err}",
                "status_code": 500, "err_type": DETOKENIZATION_ERROR,
            }
            return StrOut(token=out, new_text="")
        finally:
            if out.finished_reason is not None:
                self._states.pop(out.rid, None)

    def _str_out(self, out: TokenOut) -> StrOut:
        state = self._states.setdefault(out.rid, _DecodeState())
        if out.stop_strs:
            state.stops = out.stop_strs
        state.ids.extend(out.new_output_ids)
        finished = out.finished_reason is not None
        end = len(state.ids) - 1 if finished and _ends_with_stop_token(out) else len(state.ids)
        prefix = self._decode(state.ids[state.prefix_offset : state.read_offset], out)
        full = self._decode(state.ids[state.prefix_offset : end], out)
        new_text = full[len(prefix) :]
        if not finished and (not new_text or new_text.endswith(_REPLACEMENT_CHAR)):
            return StrOut(token=out, new_text="")  # wait for the rest of a split character
        state.prefix_offset, state.read_offset = state.read_offset, end
        pending, state.held = state.held + new_text, ""
        if finished and trims_stop_text(out):
            return self._trimmed(state, out)
        if not finished:
            held = _held_back_len(state.sent + pending, state.stops, len(pending))
            pending, state.held = pending[: len(pending) - held], pending[len(pending) - held :]
        state.sent += pending
        return StrOut(token=out, new_text=pending)

    def _decode_beams(self, out: TokenOut) -> None:
        """Each returned beam's text, its stop token dropped or its text cut where the matched
        stop string / stop_regex text begins, as the main text's is (neither with no_stop_trim)."""
        for beam in out.beam_results:
            ids = beam.output_ids
            matched = beam.finish_reason.get("matched")
            if isinstance(matched, int) and not out.no_stop_trim and ids and ids[-1] == matched:
                ids = ids[:-1]
            beam.text = self._decode(ids, out)
            if isinstance(matched, str) and beam.matched_text and not out.no_stop_trim:
                beam.text = cut_at_last(beam.text, beam.matched_text)

    def _trimmed(self, state: _DecodeState, out: TokenOut) -> StrOut:
        """The final message of a request that stopped on stop text: the whole output decoded at
        once and cut at the last match, which is exact also where the incremental pieces are not.
        When the cut reaches into text already sent, the whole text replaces it."""
        text = cut_at_last(self._decode(state.ids, out), out.matched_text)
        if text.startswith(state.sent):
            return StrOut(token=out, new_text=text[len(state.sent) :])
        return StrOut(token=out, new_text="", text=text)

    def _decode(self, ids: list[int], out: TokenOut) -> str:
        return self.decoder.decode(ids, out.skip_special_tokens, out.spaces_between_special_tokens)


def _held_back_len(text: str, stops: list[str], limit: int) -> int:
    """Length of the longest tail of `text`, at most `limit` long, that is a proper prefix of a
    stop string (stop_regex partial matches are not held back)."""
    best = 0
    for stop in stops:
        for n in range(min(len(stop) - 1, len(text), limit), best, -1):
            if text.endswith(stop[:n]):
                best = n
                break
    return best


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


def run_detokenizer_process(server_args: ServerArgs, port_args: PortArgs, index: int = 0) -> None:
    """Process entry: PULL BatchTokenOut at detokenizer `index`'s address, PUSH each BatchStrOut
    to the tokenizer worker its batch names (the one tokenizer manager with a single worker)."""
    logging.basicConfig(level=server_args.log_level.upper(), format="[detokenizer] %(levelname)s %(message)s")
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the launcher owns Ctrl-C and sends SIGTERM
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    context = zmq.Context()
    recv_sock = context.socket(zmq.PULL)
    recv_sock.bind(detokenizer_endpoints(server_args, port_args)[index])
    send_socks = {}
    for endpoint in worker_endpoints(server_args, port_args):
        send_socks[endpoint] = context.socket(zmq.PUSH)
        send_socks[endpoint].connect(endpoint)
    default_sock = next(iter(send_socks.values()))
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
            send_socks.get(batch.http_worker_ipc, default_sock).send(encode(manager.handle(batch)))
    finally:
        context.destroy(linger=0)


def results_decoder(detokenizer_process: bool, tokenizer: Any) -> Callable[[bytes], BatchStrOut]:
    """A results message -> BatchStrOut: the detokenizer process's as they are, the scheduler's
    BatchTokenOut (--detokenizer-mode inline) through a DetokenizerManager of this process."""
    if detokenizer_process:
        return decoder(BatchStrOut).decode
    detokenizer = DetokenizerManager(tokenizer)
    token_decoder = decoder(BatchTokenOut)
    return lambda data: detokenizer.handle(token_decoder.decode(data))
