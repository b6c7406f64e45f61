"""sglang.Engine: SGLang's offline engine, the server's processes without HTTP.

    import sglang as sgl
    with sgl.Engine(model_path=..., tp_size=1) as llm:
        out = llm.generate("The capital of France is", {"max_new_tokens": 8})
        outs = llm.generate(["a", "b"], {"temperature": 0})

It starts the same scheduler ranks (and detokenizer) as `python -m sglang.launch_server` and
drives the same TokenizerManager on an event loop of its own thread, so `generate` returns the
dicts `/generate` answers (a list for a batch or n > 1) and raises ValueError where `/generate`
answers 400. Keyword arguments are ServerArgs fields (the flags' names with underscores).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import difflib
import logging
import threading
from collections.abc import AsyncIterator, Iterator
from typing import Any, Optional, Union

import msgspec

from sglang.srt.entrypoints.generate_body import split_generate_body
from sglang.srt.entrypoints.launch import ChildProcesses, launch_subprocesses
from sglang.srt.managers.tokenizer_manager import TokenizerManager
from sglang.srt.server_args import PortArgs, ServerArgs
from sglang.srt.server_args_compat import compat_fields

logger = logging.getLogger(__name__)

Prompt = Union[str, list[str], None]
InputIds = Union[list[int], list[list[int]], None]


class Engine:
    def __init__(self, **kwargs: Any) -> None:
        self.server_args = _server_args(kwargs).resolve()
        if self.server_args.ignored_flags:
            logger.warning("These SGLang arguments have no effect in this engine and are ignored: %s",
                           ", ".join(self.server_args.ignored_values))
        for message in self.server_args.startup_warnings:
            logger.warning(message)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="sglang-engine-loop", daemon=True)
        self._thread.start()
        self._port_args = PortArgs.init_new()
        self._children = ChildProcesses(self.server_args, self._port_args)
        self.tokenizer_manager: Optional[TokenizerManager] = None
        try:
            ready, tokenizer = launch_subprocesses(self._children)  # tokenizer None: --skip-tokenizer-init
            self.tokenizer_manager = self._run(_new_tokenizer_manager(self.server_args, self._port_args, ready, tokenizer))
            self._children.watch(self.tokenizer_manager.fail_all)
        except BaseException:
            self.shutdown()
            raise

    # ------------------------------------------------------------------ generation

    def generate(
        self,
        prompt: Prompt = None,
        sampling_params: Union[dict, list[dict], None] = None,
        input_ids: InputIds = None,
        return_logprob: Union[bool, list[bool]] = False,
        logprob_start_len: Union[int, list[int], None] = None,
        top_logprobs_num: Union[int, list[int], None] = None,
        token_ids_logprob: Union[list[int], list[list[int]], None] = None,
        custom_logit_processor: Union[str, list[str], None] = None,
        stream: bool = False,
        **fields: Any,
    ) -> Union[dict, list[dict], Iterator[dict]]:
        """What /generate answers for the same body (`prompt` is its `text`); with stream=True an
        iterator of the cumulative chunks. Other /generate fields (e.g. rid) pass as keywords."""
        body = _body(prompt, sampling_params, input_ids, return_logprob, logprob_start_len, top_logprobs_num,
                     token_ids_logprob, custom_logit_processor, stream, fields)
        prepared, many = self._prepare(body)
        if stream:
            return self._iterate(self._stream(prepared, many))
        outs = self._run(self._tm().collect(prepared))
        return outs if many else outs[0]

    async def async_generate(self, prompt: Prompt = None, sampling_params: Union[dict, list[dict], None] = None,
                             **kwargs: Any) -> Union[dict, list[dict], AsyncIterator[dict]]:
        """generate for an asyncio caller (its own loop): awaits the result, or with stream=True
        returns an async iterator of the chunks."""
        stream = kwargs.pop("stream", False)
        body = _body(prompt, sampling_params, kwargs.pop("input_ids", None), kwargs.pop("return_logprob", False),
                     kwargs.pop("logprob_start_len", None), kwargs.pop("top_logprobs_num", None),
                     kwargs.pop("token_ids_logprob", None), kwargs.pop("custom_logit_processor", None), stream, kwargs)
        prepared, many = self._prepare(body)
        if stream:
            return self._aiterate(self._stream(prepared, many))
        outs = await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(self._tm().collect(prepared), self._loop))
        return outs if many else outs[0]

    def _prepare(self, body: dict) -> tuple[list, bool]:
        items, batch = split_generate_body(body)
        prepared = [self._tm().prepare_request(item) for item in items]
        return prepared, batch or sum(len(p.children) for p in prepared) > 1

    async def _stream(self, prepared: list, indexed: bool) -> AsyncIterator[dict]:
        async with contextlib.aclosing(self._tm().run_many(prepared)) as results:
            async for out in results:
                if not indexed:
                    del out["index"]
                yield out

    def _iterate(self, chunks: AsyncIterator[dict]) -> Iterator[dict]:
        try:
            while True:
                try:
                    yield self._run(chunks.__anext__())
                except StopAsyncIteration:
                    return
        finally:
            self._run(chunks.aclose())  # a caller that stops early aborts the request

    async def _aiterate(self, chunks: AsyncIterator[dict]) -> AsyncIterator[dict]:
        try:
            while True:
                try:
                    yield await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(chunks.__anext__(), self._loop))
                except StopAsyncIteration:
                    return
        finally:
            await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(chunks.aclose(), self._loop))

    # ------------------------------------------------------------------ the rest of the API

    def get_server_info(self) -> dict:
        """The server args and the scheduler's facts, as /get_server_info reports them."""
        ready = self._tm().ready
        info = dataclasses.asdict(self.server_args)
        info.update(scheduler_info=msgspec.structs.asdict(ready), max_total_num_tokens=ready.max_total_num_tokens,
                    max_running_requests=ready.max_running_requests)
        return info

    def flush_cache(self) -> bool:
        """As /flush_cache: False (nothing done) while requests run."""
        return self._tm().flush_cache()

    def shutdown(self) -> None:
        """Stop the scheduler ranks (and the detokenizer process); the engine cannot be used afterwards."""
        self._children.shutdown()
        if self.tokenizer_manager is not None:
            self._run(_close(self.tokenizer_manager))
            self.tokenizer_manager = None
        if self._loop.is_running():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join()

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()

    def _tm(self) -> TokenizerManager:
        if self.tokenizer_manager is None:
            raise RuntimeError("The engine has been shut down.")
        return self.tokenizer_manager

    def _run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()


def _server_args(kwargs: dict) -> ServerArgs:
    """Our fields, plus SGLang's other ServerArgs fields, accepted without effect as on the command
    line (kept in ignored_values, listed in the start-up warning)."""
    names = {f.name for f in dataclasses.fields(ServerArgs)} - {"ignored_flags", "ignored_values", "startup_warnings"}
    compat = compat_fields()
    ignored = {key: value for key, value in kwargs.items() if key not in names and key in compat}
    for key in kwargs:
        if key not in names and key not in compat:
            close = difflib.get_close_matches(key, sorted(names | set(compat)), n=1)
            raise TypeError(f"Engine() got an unknown argument {key!r}" + (f"; did you mean {close[0]!r}?" if close else "."))
    ours = {key: value for key, value in kwargs.items() if key in names}
    if ours.get("tokenizer_worker_num", 1) != 1:
        raise ValueError(
            f"tokenizer_worker_num={ours['tokenizer_worker_num']}: several tokenizer workers serve HTTP "
            "(python -m sglang.launch_server); sglang.Engine runs its one tokenizer in this process."
        )
    flags = sorted("--" + key.replace("_", "-") for key in ignored)
    return ServerArgs(**ours, ignored_flags=flags, ignored_values=ignored)


def _body(prompt: Prompt, sampling_params: Any, input_ids: InputIds, return_logprob: Any, logprob_start_len: Any,
          top_logprobs_num: Any, token_ids_logprob: Any, custom_logit_processor: Any, stream: bool,
          fields: dict) -> dict:
    body = {"text": prompt, "input_ids": input_ids, "sampling_params": sampling_params, "return_logprob": return_logprob,
            "logprob_start_len": logprob_start_len, "top_logprobs_num": top_logprobs_num,
            "token_ids_logprob": token_ids_logprob, "custom_logit_processor": custom_logit_processor, "stream": stream,
            **fields}
    return {k: v for k, v in body.items() if v is not None}


async def _new_tokenizer_manager(server_args: ServerArgs, port_args: PortArgs, ready: Any, tokenizer: Any) -> TokenizerManager:
    return TokenizerManager(server_args, port_args, ready, tokenizer)  # made on the loop that will drive it


async def _close(tm: TokenizerManager) -> None:
    tm.close()
