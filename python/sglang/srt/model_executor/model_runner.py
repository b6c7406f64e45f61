"""ModelRunner: the model, its KV cache pools, the sampler, and one step: prepare the inputs,
forward, hand the Sampler the sampled rows' logits and metadata, package its result. The scheduler
decides steps and reads their results."""

from __future__ import annotations

import logging
from typing import Optional

import torch

from sgl_kernel_ext.attention.decode_attention_cpu import cpu_decode_attention_available
from sgl_kernel_ext.layer.decode_layer_cpu import decode_layer_kernel_available
from sgl_kernel_ext.norm.rmsnorm_cpu import rmsnorm_cpu_applies
from sgl_kernel_ext.rotary.rope_store_cpu import rope_store_cpu_applies
from sglang.srt.configs.model_config import ModelConfig
from sglang.srt.distributed.communication import check_token_agreement, min_across_ranks, token_agreement_check_requested
from sglang.srt.distributed.parallel_state import tp_cpu_group, tp_device_group
from sglang.srt.layers.attention import Attention, create_attention_backend, default_attention_backend
from sglang.srt.layers.batch_invariant import batch_invariant
from sglang.srt.layers.logits_processor import LogitsProcessorOutput
from sglang.srt.layers.quantization import check_quantization_device, resolve_quant_config
from sglang.srt.layers.sampler import SamplerInput, create_sampler
from sglang.srt.layers.sampling_report import report_rows
from sglang.srt.mem_cache.memory_pool import KVCache, ReqToTokenPool, TokenToKVPoolAllocator
from sglang.srt.mem_cache.recurrent_state_pool import RecurrentStateLayout, RecurrentStatePool
from sglang.srt.model_executor.cuda_graph_runner import CudaGraphRunner, decode_graph_sizes
from sglang.srt.model_executor.forward_batch_info import ForwardBatch
from sglang.srt.model_executor.guided_rows import alpha_to_host, guide_logits, run_guide_model, store_guide_tokens
from sglang.srt.model_executor.piecewise_cuda_graph_runner import PiecewiseCudaGraphRunner, capture_token_counts
from sglang.srt.model_executor.sampling_graph import sampling_graph_supported
from sglang.srt.model_executor.verify_graph_runner import VerifyGraphRunner, VerifyGraphShape
from sglang.srt.model_executor.step import Step, StepResult, VerifyPlan
from sglang.srt.model_executor.spec_runner import run_verify
from sglang.srt.model_executor.step_output import copy_to_host, input_logprobs, output_logprobs
from sglang.srt.model_loader import load_model
from sglang.srt.sampling.step_noise import step_noise_seed
from sglang.srt.sampling.watermarking.config import WatermarkSettings
from sglang.srt.sampling.watermarking.state import WatermarkState
from sglang.srt.utils import available_ram_bytes, host_to_device

logger = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# Default KV sizing on CPU: this many positions per running request, within a slice of free RAM (capped).
DEFAULT_TOKENS_PER_REQUEST = 4096
CPU_KV_BUDGET_BYTES = 2 << 30
CPU_KV_RAM_FRACTION = 0.2
CPU_MAX_RUNNING_REQUESTS = 64
# On CUDA the KV pool takes this share of the memory left after the weights (the rest: activations,
# a prefill chunk's logits, CUDA graphs), and the running-request limit follows from the pool
# (pool / context * 512), within [1024, 2048]: the request table is int64 and mirrored on the host.
CUDA_KV_FREE_FRACTION = 0.8
CUDA_MAX_RUNNING_BOUNDS = (1024, 2048)
# Largest extend step captured in piecewise graphs when no size is given (the server passes its
# --chunked-prefill-size, so that every prefill chunk replays).
DEFAULT_PIECEWISE_MAX_TOKENS = 4096
# Hybrid models on CUDA without --max-running-requests: the per-request recurrent states take at most
# this share of the memory free after the weights (the running-request limit follows from it).
CUDA_STATE_FREE_FRACTION = 0.2


class ModelRunner:
    def __init__(
        self,
        model_path: str,
        *,
        dtype: str = "auto",
        load_format: str = "auto",
        device: str = "cpu",
        context_length: Optional[int] = None,
        max_total_tokens: Optional[int] = None,
        max_running_requests: Optional[int] = None,
        mem_fraction_static: Optional[float] = None,
        tp_rank: int = 0,
        tp_size: int = 1,
        ep_size: int = 1,
        deterministic: bool = False,
        cpu_int8_activations: bool = False,
        attention_backend: Optional[str] = None,
        disable_cuda_graph: bool = False,
        cuda_graph_max_bs: Optional[int] = None,
        cuda_graph_bs: Optional[list[int]] = None,
        disable_piecewise_cuda_graph: bool = False,
        piecewise_cuda_graph_max_tokens: Optional[int] = None,
        piecewise_cuda_graph_tokens: Optional[list[int]] = None,
        sampling_backend: str = "pytorch",
        random_seed: int = 0,
        quantization: Optional[str] = None,
        watermark: Optional[WatermarkSettings] = None,
        verify_graph: Optional[VerifyGraphShape] = None,
    ) -> None:
        self.device = torch.device(device)
        # --enable-deterministic-inference: batch-invariant forward passes.
        self.deterministic = deterministic
        self.dtype = resolve_dtype(dtype, self.device)
        self.tp_rank, self.tp_size = tp_rank, tp_size
        self.model_config = ModelConfig.from_path(model_path, context_length)
        self.vocab_size = self.model_config.vocab_size
        if cpu_int8_activations and self.device.type != "cpu":
            raise ValueError(f"cpu_int8_activations applies to the CPU engine only, got device {self.device.type}.")
        check_quantization_device(
            resolve_quant_config(self.model_config.hf_config, quantization, self.model_config.format), self.device.type
        )
        if self.device.type == "cpu":
            _build_cpu_kernels()
        self.model = load_model(
            self.model_config, model_path, self.dtype, self.device, tp_rank, tp_size, int8_activations=cpu_int8_activations,
            load_format=load_format,
            ep_size=ep_size,
            quantization=quantization,
        )
        self.mem_fraction_static = mem_fraction_static
        self._init_pools(max_total_tokens, max_running_requests)
        layout = self.kv_cache_layout
        self.attn_backend = create_attention_backend(
            attention_backend or default_attention_backend(self.device.type), self.req_to_token_pool.req_to_token,
            first_attention(self.model).num_heads, layout.num_kv_heads, layout.head_dim, self.dtype,
        )
        self._init_sampling(sampling_backend, random_seed)
        self.guide_runner: Optional[ModelRunner] = None  # --guide-model-path: the guide contexts' model
        if watermark is not None:
            slots = self.req_to_token_pool.size + 1
            self.sampler.watermark_state = WatermarkState(watermark, slots, self.model_config.context_len, self.device)
        self.cuda_graph_runner: Optional[CudaGraphRunner] = None
        self.piecewise_runner: Optional[PiecewiseCudaGraphRunner] = None
        self.verify_graph_runner: Optional[VerifyGraphRunner] = None
        if self.device.type == "cuda" and not disable_cuda_graph:
            self._init_cuda_graphs(cuda_graph_max_bs, cuda_graph_bs)
            if not disable_piecewise_cuda_graph:
                self._init_piecewise_cuda_graphs(piecewise_cuda_graph_max_tokens, piecewise_cuda_graph_tokens)
            if verify_graph is not None and self.cuda_graph_runner is not None:
                self._init_verify_graphs(verify_graph)

    def _init_sampling(self, backend: str, random_seed: int) -> None:
        self.random_seed = random_seed
        # Re-seeded before every step (step_noise_seed), so every TP rank draws the same noise.
        self.noise_generator = torch.Generator(device=self.device)
        self.sampler = create_sampler(
            backend,
            generator=self.noise_generator,
            deterministic=self.deterministic,
            tp_group=tp_device_group() if self.tp_size > 1 else None,
        )
        self.check_token_agreement = self.tp_size > 1 and token_agreement_check_requested()
        # Last sampled id of every request slot: a decode step reads its inputs on the device. The
        # extra row is the pool's padding row, which a sampling graph's padding rows write.
        self.future_tokens = torch.zeros(self.req_to_token_pool.size + 1, dtype=torch.int64, device=self.device)  # [R + 1] int64

    def _init_pools(self, max_total_tokens: Optional[int], max_running_requests: Optional[int]) -> None:
        cuda = self.device.type == "cuda"
        if max_running_requests is None and not cuda:
            max_running_requests = CPU_MAX_RUNNING_REQUESTS
        state_layout = recurrent_state_layout(self.model)
        if state_layout is not None and max_running_requests is None:
            max_running_requests = self._state_bounded_requests(state_layout)
        # Allocated before the KV pool is sized, so that the KV budget is what the states leave.
        self.state_pool = None
        if state_layout is not None:
            # One row per request slot (the spare slot included) plus the request pool's padding row.
            self.state_pool = RecurrentStatePool(state_layout, max_running_requests + 2, self.device)
        self.kv_cache_layout = self.model.kv_cache_layout()
        self.max_total_num_tokens = max_total_tokens or self._default_max_total_tokens(max_running_requests)
        if max_running_requests is None:
            low, high = CUDA_MAX_RUNNING_BOUNDS
            max_running_requests = min(max(self.max_total_num_tokens * 512 // self.model_config.context_len, low), high)
        self.max_running_requests = max_running_requests
        # One spare request slot: a chunked prefill can hold one while a full batch decodes.
        self.req_to_token_pool = ReqToTokenPool(max_running_requests + 1, self.model_config.context_len, self.device)
        self.token_to_kv_pool_allocator = TokenToKVPoolAllocator(self.max_total_num_tokens)
        self.kv_cache = KVCache.from_layout(self.max_total_num_tokens, self.kv_cache_layout, self.dtype, self.device)
        logger.info(
            "KV cache: %d tokens (%.1f MiB, %s) for %d running requests, context %d.",
            self.max_total_num_tokens, self.kv_cache.mem_bytes() / 2**20, self.dtype, max_running_requests,
            self.model_config.context_len,
        )
        if self.state_pool is not None:
            logger.info("Recurrent states: %d request slots (%.1f MiB).", max_running_requests, self.state_pool.mem_bytes() / 2**20)

    def _init_cuda_graphs(self, max_bs: Optional[int], explicit: Optional[list[int]]) -> None:
        if not self.attn_backend.supports_cuda_graph:
            logger.info("CUDA graphs off: the %s attention backend cannot be captured.", type(self.attn_backend).__name__)
            return
        free, _ = torch.cuda.mem_get_info(self.device)
        if self.tp_size > 1:
            free = min_across_ranks(free, tp_cpu_group())  # every rank must capture the same buckets
        capture_sampling = sampling_graph_supported(self.sampler)
        # By default every running batch fits one graph; a larger batch replays in chunks.
        sizes = decode_graph_sizes(self, max_bs or self.max_running_requests, explicit, free, capture_sampling)
        if not sizes:
            return
        with torch.inference_mode():
            self.cuda_graph_runner = CudaGraphRunner(
                self, sizes, capture_sampling=capture_sampling, watermark=self.sampler.watermark_state
            )
        # The agreement check reads every step's ids on the host, which a captured sampling step never does.
        if self.cuda_graph_runner.sampling is not None and not self.check_token_agreement:
            self.sampler.attach_graph(self.cuda_graph_runner)

    def _extend_graphs_apply(self, what: str) -> bool:
        """Whether extend steps may be captured (piecewise or verify graphs); logs why not."""
        if self.deterministic:
            # Extend steps stay on the eager batch-invariant path that mode is checked on.
            logger.info("%s off: --enable-deterministic-inference runs extend steps eagerly.", what)
            return False
        if not getattr(self.model.model, "extend_graphs_supported", True):
            logger.info("%s off: this model's RoPE depends on each sequence's length.", what)
            return False
        if self.state_pool is not None:
            logger.info("%s off: the linear-attention layers run extend steps eagerly.", what)
            return False
        return True

    def _init_verify_graphs(self, shape: VerifyGraphShape) -> None:
        if self._extend_graphs_apply("Speculative verify CUDA graphs"):
            with torch.inference_mode():
                self.verify_graph_runner = VerifyGraphRunner(self, shape)

    @property
    def verify_plan(self) -> VerifyPlan:
        """Verify steps replay the verify graphs where they exist; else each token is a decode row,
        except for models with per-request recurrent state (rows of one request would share it)."""
        if self.verify_graph_runner is not None:
            return VerifyPlan(graph_width=self.verify_graph_runner.width)
        return VerifyPlan(decode_rows=self.state_pool is None)

    def _init_piecewise_cuda_graphs(self, max_tokens: Optional[int], explicit: Optional[list[int]]) -> None:
        if not self._extend_graphs_apply("Piecewise CUDA graphs"):
            return
        counts = capture_token_counts(max_tokens or DEFAULT_PIECEWISE_MAX_TOKENS, explicit)
        with torch.inference_mode():
            self.piecewise_runner = PiecewiseCudaGraphRunner(self, counts)

    def _state_bounded_requests(self, layout: RecurrentStateLayout) -> int:
        """CUDA default for a hybrid model: as many running requests as CUDA_STATE_FREE_FRACTION of the
        free memory holds states for, within CUDA_MAX_RUNNING_BOUNDS' upper bound."""
        free, _ = torch.cuda.mem_get_info(self.device)
        fits = int(free * CUDA_STATE_FREE_FRACTION) // layout.bytes_per_request()
        return max(1, min(fits, CUDA_MAX_RUNNING_BOUNDS[1]))

    def _default_max_total_tokens(self, max_running_requests: Optional[int]) -> int:
        per_token = self.kv_cache_layout.bytes_per_token(self.dtype.itemsize)
        tokens = max(1, self._kv_budget_bytes() // per_token)
        if max_running_requests is not None:
            tokens = min(tokens, max_running_requests * min(self.model_config.context_len, DEFAULT_TOKENS_PER_REQUEST))
        if self.tp_size > 1:
            # Each rank measures its own free memory; all must hold the same capacity, or their
            # admission decisions (and with them the collectives) would diverge.
            tokens = min_across_ranks(tokens, tp_cpu_group())
        return tokens

    def _kv_budget_bytes(self) -> int:
        """--mem-fraction-static of the memory free after the weights (GPU memory, or available
        RAM on CPU); without it 0.8 of the GPU's, or min(2 GiB, 0.2 x available RAM)."""
        fraction = self.mem_fraction_static
        if self.device.type == "cuda":
            free, _ = torch.cuda.mem_get_info(self.device)
            return int(free * (fraction or CUDA_KV_FREE_FRACTION))
        free_ram = available_ram_bytes()
        if fraction is not None:
            return int(free_ram * fraction)
        return min(CPU_KV_BUDGET_BYTES, int(free_ram * CPU_KV_RAM_FRACTION))

    @torch.inference_mode()
    def forward(self, forward_batch: ForwardBatch) -> LogitsProcessorOutput:
        """next_token_logits [B, V] float32 of each request's last new token (and
        input_token_logits [N, V] when forward_batch.return_input_logits). A decode batch replays
        the captured graphs (in chunks when it is larger than the largest); an extend step within
        the piecewise graphs' token counts replays their pieces around eager attention."""
        forward_batch.kv_cache, forward_batch.attn_backend = self.kv_cache, self.attn_backend
        forward_batch.state_pool = self.state_pool
        if self.state_pool is not None and forward_batch.forward_mode.is_extend():
            self._reset_new_requests(forward_batch)
        self.req_to_token_pool.write_forward_batch(
            forward_batch.req_pool_indices, forward_batch.extend_seq_lens, forward_batch.positions, forward_batch.out_cache_loc
        )
        if self.cuda_graph_runner is not None and self.cuda_graph_runner.can_run(forward_batch):
            return self.cuda_graph_runner.replay(forward_batch)
        if self.verify_graph_runner is not None and self.verify_graph_runner.can_run(forward_batch):
            return self.verify_graph_runner.replay(forward_batch)
        if self.piecewise_runner is not None and self.piecewise_runner.can_run(forward_batch):
            self.attn_backend.init_forward_metadata(forward_batch)
            return self.model.compute_logits(self.piecewise_runner.replay(forward_batch), forward_batch)
        with batch_invariant(self.deterministic):
            self.attn_backend.init_forward_metadata(forward_batch)
            return self.model(forward_batch)


    def _reset_new_requests(self, forward_batch: ForwardBatch) -> None:
        """Zero the recurrent states of the requests this extend starts (no prefix before it); a
        later chunk of a prompt carries its state on."""
        new = [i for i, prefix in enumerate(forward_batch.extend_prefix_lens_cpu) if prefix == 0]
        rows = forward_batch.req_pool_indices
        if len(new) < forward_batch.batch_size:
            rows = rows.index_select(0, host_to_device(torch.tensor(new, dtype=torch.int64), self.device))
        self.state_pool.reset(rows)

    @torch.inference_mode()
    def run(self, step: Step) -> StepResult:
        """prepare -> forward -> sample one scheduled step; nothing here waits for the GPU."""
        if step.spec is not None:
            return run_verify(self, step)
        batch = step.forward_batch
        if step.mode.is_decode():
            batch.input_ids = self.future_tokens.index_select(0, batch.req_pool_indices).clamp(min=0)
        replayed = self.cuda_graph_runner is not None and self.cuda_graph_runner.can_run(batch)
        # A prefill step may carry guide-model prompt chunks alone: the served model then has no row.
        output = self.forward(batch) if batch.batch_size else None
        guide_output = run_guide_model(step, self.guide_runner)
        prompt_logprobs = input_logprobs(step, batch, output)
        if step.sampled_batch is None:
            return StepResult(torch.empty(0, dtype=torch.int64), None, {}, [], prompt_logprobs)
        self.noise_generator.manual_seed(step_noise_seed(self.random_seed, step.index))
        sampler_input = self._sampler_input(step, output, guide_output, replayed)
        if step.mode.is_extend():
            self._start_watermark(sampler_input)
        sampled = self.sampler.sample_step(sampler_input)
        store_guide_tokens(step, sampled.next_ids, self.future_tokens, self.guide_runner, self.device)
        alpha = alpha_to_host(step, sampled.guidance_alpha)  # copied before the ids: their event covers it
        if self.check_token_agreement:
            rids = [step.reqs[r].rid for r in step.sample_rows]
            check_token_agreement(sampled.next_ids, step.index, rids, tp_device_group())
        ids_host, ready = copy_to_host(sampled.next_ids)
        logprobs = [None] * len(sampled.asks)
        if sampled.logprobs is not None:
            logprobs = output_logprobs(sampled.logprobs, sampled.asks)
        # Beam rows: the scheduler selects from these before it submits their next step.
        beam_topk = None if sampled.beam_topk is None else tuple(t.cpu() for t in sampled.beam_topk)
        reports = report_rows(sampled.report, len(sampled.asks))
        return StepResult(ids_host, ready, sampled.row_errors, logprobs, prompt_logprobs, beam_topk=beam_topk,
                          guidance_alpha=alpha, reports=reports)

    def _start_watermark(self, inp: SamplerInput) -> None:
        """Load the context tails of the watermarked rows whose prompt this extend step completes."""
        state, wm = self.sampler.watermark_state, inp.info.watermark
        if state is None or wm is None:
            return
        reqs = [inp.rows[i] for i in wm.rows_host]
        slots = inp.token_store[1].index_select(0, wm.rows)
        state.start(slots, [r.origin_input_ids for r in reqs], [r.output_ids for r in reqs], wm.windows_host)

    def _sampler_input(
        self, step: Step, output: LogitsProcessorOutput, guide_output: Optional[LogitsProcessorOutput], replayed: bool
    ) -> SamplerInput:
        """The sampled rows' logits and metadata; their ids go to `future_tokens` at their request slots."""
        batch = step.forward_batch
        if len(step.sample_rows) == batch.batch_size:
            logits, slots = output.next_token_logits, batch.req_pool_indices  # [B, V], [B]
        else:
            rows = host_to_device(step.sample_rows, self.device)
            logits = output.next_token_logits.index_select(0, rows)  # [S, V]
            slots = batch.req_pool_indices.index_select(0, rows)  # [S]
        return SamplerInput(
            logits=logits,
            info=step.sampling_info,
            positions=step.positions,
            rows=[step.reqs[r] for r in step.sample_rows],
            host_ready=step.grammar_wait,
            graph_rows=batch.batch_size if replayed else None,
            token_store=(self.future_tokens, slots),
            beam=(host_to_device(step.beam_rows, self.device), step.beam_candidates) if step.beam_rows else None,
            guide_logits=guide_logits(step, output, guide_output, self.device),
        )


def first_attention(model: torch.nn.Module) -> Attention:
    """The model's first attention layer: its (TP-local) head counts size the attention backend."""
    return next(m for m in model.modules() if isinstance(m, Attention))


def recurrent_state_layout(model: torch.nn.Module) -> Optional[RecurrentStateLayout]:
    """Per-request recurrent state of a hybrid model (`recurrent_state_layout()`), else None."""
    return model.recurrent_state_layout() if hasattr(model, "recurrent_state_layout") else None


def _build_cpu_kernels() -> None:
    """Compile (or load from the cache) the C kernels the CPU layers use, now rather than inside
    the first request; the linears' kernel is built by the loader."""
    probe = torch.zeros(1, 2)
    cpu_decode_attention_available()
    rmsnorm_cpu_applies(probe, torch.zeros(2))
    rope_store_cpu_applies(probe, torch.zeros(1, 1, 2))
    decode_layer_kernel_available()


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be auto or one of {sorted(DTYPES)}, got {dtype!r}.")
    return DTYPES[dtype]
