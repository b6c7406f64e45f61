"""--guide-model-path: a second model in each scheduler process, beside the served one, that runs
the guide contexts of requests whose guidance says `"model": "guide"`.

It is loaded on the forward worker like the served model, TP-sharded the same way (same ranks,
same groups), with its own request table, KV pool (--guide-max-total-tokens) and prefix cache, and
an admission policy over them. Its vocabulary size must be the served model's: the two contexts'
logits are mixed token by token."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
import torch

from sglang.srt.managers.guidance_pairs import KVSide
from sglang.srt.managers.request_intake import kv_budget
from sglang.srt.managers.schedule_policy import SchedulePolicy
from sglang.srt.managers.scheduler_process import runner_execution_args
from sglang.srt.mem_cache.radix_cache import RadixCache
from sglang.srt.model_executor.model_runner import ModelRunner
from sglang.srt.server_args import ServerArgs


class GuideModel:
    def __init__(self, server_args: ServerArgs, worker: ThreadPoolExecutor, device: torch.device, tp_rank: int,
                 main: ModelRunner) -> None:
        args = server_args
        self.runner: ModelRunner = worker.submit(
            ModelRunner,
            args.guide_model_path,
            max_total_tokens=args.guide_max_total_tokens,
            max_running_requests=main.max_running_requests,
            **runner_execution_args(args, device, tp_rank),
        ).result()
        if self.runner.vocab_size != main.vocab_size:
            raise ValueError(
                f"--guide-model-path: the guide model's vocabulary has {self.runner.vocab_size} tokens, the served "
                f"model's {main.vocab_size}; guidance mixes their logits token by token, so they must be equal."
            )
        main.guide_runner = self.runner
        context_len = main.model_config.context_len
        pool = self.runner.req_to_token_pool
        self.tree_cache = RadixCache(
            pool, self.runner.token_to_kv_pool_allocator, disable=args.disable_radix_cache,
            align=args.chunked_prefill_size if args.enable_deterministic_inference else 1,
        )
        self.side = KVSide(self.tree_cache, pool)
        self.policy = SchedulePolicy(
            args.schedule_policy, args.chunked_prefill_size, args.enable_deterministic_inference, self.tree_cache, pool,
            main.max_running_requests, lambda req: kv_budget(req, context_len),
        )
        self.max_total_tokens = self.runner.max_total_num_tokens
