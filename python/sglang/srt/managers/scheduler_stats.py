"""What the scheduler reports about itself: the step counter, the progress log lines (one per
prefill step, one every --decode-log-interval decode steps, in SGLang's wording, which tools
reading SGLang logs expect) and the load snapshot (SchedulerLoad: /get_server_info, /metrics)."""

from __future__ import annotations

import logging
import time

from sglang.srt.managers.io_struct import SchedulerLoad
from sglang.srt.managers.step_failures import StepFailureLimit
from sglang.srt.mem_cache.memory_pool import ReqToTokenPool
from sglang.srt.mem_cache.radix_cache import RadixCache
from sglang.srt.metrics.histogram import Histogram
from sglang.srt.model_executor.forward_batch_info import ForwardMode
from sglang.srt.model_executor.step import Step

logger = logging.getLogger(__name__)


class SchedulerStats:
    def __init__(
        self,
        decode_log_interval: int,
        tree_cache: RadixCache,
        req_to_token_pool: ReqToTokenPool,
        max_total_tokens: int,
        failures: StepFailureLimit,
    ) -> None:
        self.decode_log_interval = decode_log_interval
        self.tree_cache = tree_cache
        self.req_to_token_pool = req_to_token_pool
        self.max_total_tokens = max_total_tokens
        self.failures = failures
        self.step_count = 0
        self.step_time = Histogram()  # submit -> result read, observed by the ResultProcessor
        self.decode_steps, self.decode_tokens, self.decode_log_time = 0, 0, time.perf_counter()
        self.gen_throughput = 0.0  # decode tokens/s at the last decode log line
        self.cache_hit_rate = 0.0  # cached / (cached + new) prompt tokens of the last prefill step

    def count(self, step: Step, running: int, queued: int) -> None:
        """Number the step (the same on every TP rank) and log it. `running`: admitted requests;
        `queued`: waiting ones."""
        self.step_count += 1
        step.index = self.step_count
        self._log(step, running, queued)

    def _log(self, step: Step, running: int, queued: int) -> None:
        # Cached prefixes nobody uses count as free.
        used = self.max_total_tokens - self.tree_cache.available_size()
        if step.mode == ForwardMode.EXTEND:
            new_tokens = sum(step.forward_batch.extend_seq_lens_cpu)
            cached = sum(r.cached_tokens for r in step.reqs)
            self.cache_hit_rate = cached / max(cached + new_tokens, 1)
            logger.info(
                "Prefill batch. #new-seq: %d, #new-token: %d, #cached-token: %d, #running-req: %d, #queue-req: %d",
                len(step.reqs), new_tokens, cached, running, queued,
            )
            return
        self.decode_steps += 1
        self.decode_tokens += len(step.reqs)
        if self.decode_steps % self.decode_log_interval:
            return
        now = time.perf_counter()
        throughput = self.decode_tokens / max(now - self.decode_log_time, 1e-9)
        self.gen_throughput = throughput
        self.decode_log_time, self.decode_tokens = now, 0
        logger.info(
            "Decode batch. #running-req: %d, #token: %d, token usage: %.2f, gen throughput (token/s): %.2f, #queue-req: %d",
            len(step.reqs), used, used / self.max_total_tokens, throughput, queued,
        )

    def load(self, req_id: int, running: int, queued: int, grammar_queued: int = 0) -> SchedulerLoad:
        """The load snapshot answering GetLoadReq `req_id`; `grammar_queued` of the `queued`
        requests wait for their grammar's compile."""
        pool = self.req_to_token_pool
        free, evictable = self.tree_cache.allocator.available_size(), self.tree_cache.evictable_size()
        used = self.max_total_tokens - free - evictable
        return SchedulerLoad(
            req_id=req_id,
            num_running_reqs=running,
            num_queue_reqs=queued,
            req_slots_free=pool.available_size(),
            req_slots_total=pool.size,
            max_total_num_tokens=self.max_total_tokens,
            num_free_tokens=free,
            num_evictable_tokens=evictable,
            num_used_tokens=used,
            token_usage=used / self.max_total_tokens,
            num_steps=self.step_count,
            num_failed_steps=self.failures.total,
            step_time_buckets=self.step_time.buckets,
            step_time_counts=self.step_time.cumulative(),
            step_time_sum=self.step_time.sum,
            num_grammar_queue_reqs=grammar_queued,
            gen_throughput=self.gen_throughput,
            cache_hit_rate=self.cache_hit_rate,
        )
