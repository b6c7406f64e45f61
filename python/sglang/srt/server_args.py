"""ServerArgs: every launch flag, with SGLang's names, and the defaults resolved at start-up."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
from typing import Any, Optional

from sglang.srt.function_call import TOOL_CALL_PARSERS
from sglang.srt.parser.reasoning_parser import REASONING_PARSERS
from sglang.srt.sampling.watermarking.config import WatermarkSettings
from sglang.srt.port_args import PortArgs  # noqa: F401 (re-exported)
from sglang.srt.server_args_cli import (  # noqa: F401 (GRAMMAR_BACKEND_CHOICES: re-exported)
    ATTENTION_BACKEND_CHOICES,
    GRAMMAR_BACKEND_CHOICES,
    LOAD_BALANCE_METHODS,
    LOAD_FORMATS,
    LOG_REQUESTS_LEVELS,
    SAMPLING_DEFAULTS_CHOICES,
    SCHEDULE_POLICY_CHOICES,
    SCHEDULE_POLICY_SUPPORTED,
    SGLANG_ATTENTION_BACKENDS,
    SGLANG_LOAD_FORMATS,
    USABLE_ATTENTION_BACKENDS,
    add_server_cli_args,
)
from sglang.srt.speculative.spec_args import NGRAM_MAX_TRIE_DEPTH, resolve_speculative_args
from sglang.srt.server_args_compat import add_compat_args, compat_fields, ignored_flags, ignored_values, parse_args
from sglang.srt.utils.embedded_model import embedded_model_path

@dataclasses.dataclass
class ServerArgs:
    model_path: Optional[str] = None
    tokenizer_path: Optional[str] = None
    skip_tokenizer_init: bool = False
    served_model_name: Optional[str] = None
    trust_remote_code: bool = False
    chat_template: Optional[str] = None
    host: str = "127.0.0.1"
    port: int = 30000
    dtype: str = "auto"
    load_format: str = "auto"
    quantization: Optional[str] = None
    device: Optional[str] = None
    tp_size: int = 1
    ep_size: int = 1
    dist_timeout: int = 300
    disable_custom_all_reduce: bool = False
    dp_size: int = 1
    load_balance_method: str = "round_robin"  # SGLang's default
    load_watch_interval: float = 0.1
    base_gpu_id: int = 0
    gpu_id_step: int = 1
    nnodes: int = 1
    node_rank: int = 0
    dist_init_addr: Optional[str] = None
    context_length: Optional[int] = None
    max_running_requests: Optional[int] = None
    max_queued_requests: Optional[int] = None
    max_total_tokens: Optional[int] = None
    # Guidance (sampling_params.guidance "model": "guide"): a second model and its KV capacity.
    guide_model_path: Optional[str] = None
    guide_max_total_tokens: Optional[int] = None
    mem_fraction_static: Optional[float] = None
    chunked_prefill_size: Optional[int] = None
    schedule_policy: str = "fcfs"
    enable_priority_scheduling: bool = False
    schedule_low_priority_values_first: bool = False
    default_priority_value: Optional[int] = None
    abort_on_priority_when_disabled: bool = False
    disable_priority_preemption: bool = False
    priority_scheduling_preemption_threshold: int = 10  # SGLang's default
    disable_radix_cache: bool = False
    sampling_backend: Optional[str] = None
    grammar_backend: str = "xgrammar"
    constrained_json_disable_any_whitespace: bool = False
    tool_call_parser: Optional[str] = None
    reasoning_parser: Optional[str] = None
    enable_custom_logit_processor: bool = False
    custom_logit_processor_allowlist: Optional[list[str]] = None
    enable_watermark: bool = False
    watermark_config: Optional[str] = dataclasses.field(default=None, repr=False)  # JSON or a file path; may hold keys
    logits_processors: Optional[list[str]] = None
    thinking_markers: tuple[str, str] = ("<think>", "</think>")
    enable_deterministic_inference: bool = False
    cpu_int8_activations: bool = False
    disable_overlap_schedule: bool = False
    detokenizer_mode: Optional[str] = None
    attention_backend: Optional[str] = None
    disable_cuda_graph: bool = False
    cuda_graph_max_bs: Optional[int] = None
    cuda_graph_bs: Optional[list[int]] = None
    disable_piecewise_cuda_graph: bool = False
    piecewise_cuda_graph_max_tokens: Optional[int] = None
    piecewise_cuda_graph_tokens: Optional[list[int]] = None
    sampling_defaults: str = "model"
    preferred_sampling_params: Optional[str] = None
    max_top_logprobs_num: int = 20
    sampling_mask_max_tokens: int = 4096  # SGLang's default
    decode_log_interval: int = 40
    stream_interval: int = 1
    stream_output: bool = False
    random_seed: int = 0
    api_key: Optional[str] = None
    max_request_body_bytes: int = 32 * 2**20
    graceful_shutdown_timeout: float = 10.0
    step_failure_limit: int = 5
    step_failure_window: int = 100
    enable_metrics: bool = False
    log_level: str = "info"
    log_requests: bool = False
    log_requests_level: int = 2  # SGLang's default
    detokenizer_worker_num: int = 1
    tokenizer_worker_num: int = 1
    # Speculative decoding (speculative/spec_args.py).
    speculative_algorithm: Optional[str] = None
    speculative_draft_model_path: Optional[str] = None
    speculative_num_steps: Optional[int] = None
    speculative_eagle_topk: Optional[int] = None
    speculative_num_draft_tokens: Optional[int] = None
    speculative_ngram_max_trie_depth: int = NGRAM_MAX_TRIE_DEPTH
    speculative_ngram_min_match_window_size: Optional[int] = None
    speculative_disable_batch_size: Optional[int] = None
    # What resolve() changed because this machine or build cannot honour a flag (logged at start-up).
    startup_warnings: list[str] = dataclasses.field(default_factory=list)
    # SGLang flags the command passed that have no effect here (set by prepare_server_args).
    ignored_flags: list[str] = dataclasses.field(default_factory=list)
    # Their values by SGLang's field name, readable as attributes as on SGLang's ServerArgs.
    ignored_values: dict[str, Any] = dataclasses.field(default_factory=dict)

    def __getattr__(self, name: str) -> Any:
        """Only reached for names that are not ours: an SGLang field we accept without effect
        reads as the value passed, else None (False for a switch); anything else is an error."""
        values = self.__dict__.get("ignored_values", {})
        if name in values:
            return values[name]
        switch = compat_fields().get(name)
        if switch is None:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        return False if switch else None

    def resolve(self) -> "ServerArgs":
        """Fill what depends on the machine: model path, device, sampling backend, names."""
        if self.served_model_name is None and self.model_path is not None:
            self.served_model_name = self.model_path  # SGLang's model id: --model-path as given
        if self.model_path is None:
            self.model_path = embedded_model_path()
        if self.tokenizer_path is None:
            self.tokenizer_path = self.model_path
        if self.served_model_name is None:  # the embedded model: its file's name
            self.served_model_name = os.path.basename(os.path.normpath(self.model_path))
        if self.device is None:
            self.device = _default_device()
        if self.sampling_backend is None:
            self.sampling_backend = _default_sampling_backend(self.device)
        if self.chunked_prefill_size is None:
            self.chunked_prefill_size = _default_chunked_prefill_size(self.device)
        if self.detokenizer_mode is None:
            self.detokenizer_mode = _default_detokenizer_mode(self.device)
        if self.attention_backend is None:
            self.attention_backend = default_attention_backend(self.device)
        self._fall_back_attention_backend()
        if self.detokenizer_worker_num > 1 and not self.detokenizer_process():
            self.startup_warnings.append(
                f"--detokenizer-worker-num {self.detokenizer_worker_num} has no effect with --detokenizer-mode inline: "
                "no detokenizer process runs, each tokenizer worker is the one detokenizer of its own requests."
            )
        self.validate()
        self._check_quantization()
        if self.tp_size > 1:
            self._check_tp_size()
        if self.device == "cuda":
            self._check_gpu_ids()
        return self

    def _fall_back_attention_backend(self) -> None:
        """SGLang's backends that this device or build lacks (triton, flashinfer, fa3 on a CPU
        machine, ...) serve with the device's default backend instead, with a warning."""
        usable = USABLE_ATTENTION_BACKENDS.get(self.device, ())
        known = self.attention_backend in SGLANG_ATTENTION_BACKENDS or self.attention_backend == "cpu"
        if known and self.attention_backend not in usable:
            fallback = default_attention_backend(self.device)
            self.startup_warnings.append(
                f"--attention-backend {self.attention_backend} is not available on this {self.device} "
                f"machine or build; serving with --attention-backend {fallback}."
            )
            self.attention_backend = fallback

    def detokenizer_process(self) -> bool:
        """Whether a detokenizer process sits between rank 0 and the tokenizer manager (else the
        tokenizer manager detokenizes; see --detokenizer-mode)."""
        return self.detokenizer_mode != "inline"

    def validate(self) -> None:
        self._validate_parallelism()
        if self.schedule_policy not in SCHEDULE_POLICY_SUPPORTED:
            known = "SGLang's" if self.schedule_policy in SCHEDULE_POLICY_CHOICES else "an unknown"
            raise ValueError(
                f"--schedule-policy {self.schedule_policy!r} is {known} policy that this server does not implement; "
                f"supported: {', '.join(SCHEDULE_POLICY_SUPPORTED)}."
            )
        if self.sampling_defaults not in SAMPLING_DEFAULTS_CHOICES:
            raise ValueError(f"--sampling-defaults must be one of {SAMPLING_DEFAULTS_CHOICES}, got {self.sampling_defaults!r}.")
        for name in ("max_running_requests", "max_queued_requests", "max_request_body_bytes", "step_failure_limit",
                     "step_failure_window", "chunked_prefill_size", "tp_size", "dist_timeout", "cuda_graph_max_bs",
                     "piecewise_cuda_graph_max_tokens", "decode_log_interval", "stream_interval",
                     "tokenizer_worker_num", "detokenizer_worker_num"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be at least 1, got {value}.")
        if self.cuda_graph_bs is not None and any(b < 1 for b in self.cuda_graph_bs):
            raise ValueError(f"--cuda-graph-bs sizes must be at least 1, got {self.cuda_graph_bs}.")
        if self.piecewise_cuda_graph_tokens is not None and any(t < 1 for t in self.piecewise_cuda_graph_tokens):
            raise ValueError(f"--piecewise-cuda-graph-tokens must be at least 1, got {self.piecewise_cuda_graph_tokens}.")
        if self.attention_backend is not None and self.attention_backend not in ATTENTION_BACKEND_CHOICES:
            raise ValueError(
                f"--attention-backend must be one of {', '.join(ATTENTION_BACKEND_CHOICES)}, got {self.attention_backend!r}."
            )
        if self.tool_call_parser is not None and self.tool_call_parser not in TOOL_CALL_PARSERS:
            raise ValueError(f"--tool-call-parser must be one of {', '.join(TOOL_CALL_PARSERS)}, got {self.tool_call_parser!r}.")
        if self.reasoning_parser is not None and self.reasoning_parser not in REASONING_PARSERS:
            raise ValueError(f"--reasoning-parser must be one of {', '.join(REASONING_PARSERS)}, got {self.reasoning_parser!r}.")
        if self.log_requests_level not in LOG_REQUESTS_LEVELS:
            raise ValueError(f"--log-requests-level must be one of 0, 1, 2, 3, got {self.log_requests_level!r}.")
        if self.skip_tokenizer_init and self.chat_template is not None:
            raise ValueError("--chat-template needs a tokenizer; it cannot be used with --skip-tokenizer-init.")
        if self.chat_template is not None and not os.path.isfile(self.chat_template):
            raise ValueError(
                f"--chat-template must be a Jinja template file, got {self.chat_template!r} (not a file; "
                "SGLang's built-in template names are not supported here)."
            )
        if self.mem_fraction_static is not None and not 0.0 < self.mem_fraction_static <= 1.0:
            raise ValueError(f"--mem-fraction-static must be in (0, 1], got {self.mem_fraction_static}.")
        if self.graceful_shutdown_timeout < 0:
            raise ValueError(f"--graceful-shutdown-timeout must be >= 0, got {self.graceful_shutdown_timeout}.")
        if self.cpu_int8_activations and self.device not in (None, "cpu"):
            raise ValueError(f"--cpu-int8-activations applies to the CPU engine only, got --device {self.device}.")
        _check_quantization_flag(self.quantization)
        self._validate_priority()
        if self.sampling_mask_max_tokens < 1:
            raise ValueError(f"--sampling-mask-max-tokens must be positive (got {self.sampling_mask_max_tokens}).")
        if self.max_top_logprobs_num < 0:
            raise ValueError(f"--max-top-logprobs-num must be >= 0, got {self.max_top_logprobs_num}.")
        if self.load_format not in LOAD_FORMATS:
            known = "SGLang's" if self.load_format in SGLANG_LOAD_FORMATS else "an unknown"
            raise ValueError(
                f"--load-format {self.load_format!r} is {known} format that this server does not implement; "
                f"supported: {', '.join(LOAD_FORMATS)}."
            )
        self.preferred_sampling_params_dict()
        self.watermark_settings()

    def _validate_priority(self) -> None:
        if self.enable_priority_scheduling and self.schedule_policy != "fcfs":
            raise ValueError(
                f"To use priority scheduling, --schedule-policy must be 'fcfs'; {self.schedule_policy!r} is not supported."
            )
        resolve_speculative_args(self)

    def _validate_parallelism(self) -> None:
        from sglang.srt.distributed.placement import parse_dist_init_addr

        for name in ("dp_size", "nnodes"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(self, name)}.")
        if self.load_balance_method not in LOAD_BALANCE_METHODS:
            raise ValueError(
                f"--load-balance-method must be one of {', '.join(LOAD_BALANCE_METHODS)}, got {self.load_balance_method!r}."
            )
        if self.load_watch_interval <= 0:
            raise ValueError(f"--load-watch-interval must be > 0, got {self.load_watch_interval}.")
        if self.base_gpu_id < 0 or self.gpu_id_step < 0:
            raise ValueError(f"--base-gpu-id and --gpu-id-step must be >= 0, got {self.base_gpu_id} and {self.gpu_id_step}.")
        if not 0 <= self.node_rank < self.nnodes:
            raise ValueError(f"--node-rank must be in [0, {self.nnodes - 1}] (--nnodes {self.nnodes}), got {self.node_rank}.")
        if self.ep_size < 1 or self.tp_size % self.ep_size:
            raise ValueError(
                f"--ep-size {self.ep_size} must be at least 1 and divide --tp-size {self.tp_size} "
                "(experts are split inside the TP group)."
            )
        if self.tp_size % self.nnodes:
            raise ValueError(
                f"--tp-size {self.tp_size} must be a multiple of --nnodes {self.nnodes}: each node runs tp-size/nnodes ranks of every replica."
            )
        if self.nnodes > 1 and self.dist_init_addr is None:
            raise ValueError("--nnodes > 1 needs --dist-init-addr HOST:PORT (node 0's address, reachable from every node).")
        if self.nnodes > 1 and self.enable_custom_logit_processor and not self.custom_logit_processor_allowlist:
            # Other nodes would unpickle the request's processor from their process-group connection.
            raise ValueError(
                "--enable-custom-logit-processor with --nnodes > 1 needs --custom-logit-processor-allowlist: "
                "without it, a request's dill payload would be unpickled on the other nodes."
            )
        if self.dist_init_addr is not None:
            parse_dist_init_addr(self.dist_init_addr)

    def _check_gpu_ids(self) -> None:
        """Every rank of this node must land on a visible GPU."""
        import torch

        from sglang.srt.distributed.placement import gpu_id, node_tp_ranks

        ranks = node_tp_ranks(self.tp_size, self.nnodes, self.node_rank)
        top = max(gpu_id(d, r, self.tp_size, self.nnodes, self.base_gpu_id, self.gpu_id_step)
                  for d in range(self.dp_size) for r in ranks)
        if top >= torch.cuda.device_count():
            raise ValueError(
                f"--dp-size {self.dp_size} x --tp-size {self.tp_size} (per node {len(ranks)}) with --base-gpu-id "
                f"{self.base_gpu_id} --gpu-id-step {self.gpu_id_step} needs GPU {top}; {torch.cuda.device_count()} are "
                "visible (--gpu-id-step 0 puts every rank on one GPU)."
            )

    def _check_quantization(self) -> None:
        """Refuse, before any process starts, a quantised model the device cannot serve (FP8 on CPU)
        or a --quantization that contradicts the checkpoint."""
        if self.quantization is None and not os.path.isfile(os.path.join(self.model_path, "config.json")):
            return
        from sglang.srt.configs.model_config import ModelConfig
        from sglang.srt.layers.quantization import check_quantization_device, resolve_quant_config

        config = ModelConfig.from_path(self.model_path)
        check_quantization_device(resolve_quant_config(config.hf_config, self.quantization, config.format), self.device)

    def _check_tp_size(self) -> None:
        """Refuse a TP size the model or the machine cannot take before any rank is spawned."""
        from sglang.srt.configs.model_config import ModelConfig
        from sglang.srt.distributed.tp_sizes import check_tp_size

        check_tp_size(ModelConfig.from_path(self.model_path, self.context_length), self.tp_size)

    def preferred_sampling_params_dict(self) -> dict[str, Any]:
        if not self.preferred_sampling_params:
            return {}
        try:
            value = json.loads(self.preferred_sampling_params)
        except json.JSONDecodeError as err:
            raise ValueError(f"--preferred-sampling-params must be a JSON object: {err}") from err
        if not isinstance(value, dict):
            raise ValueError("--preferred-sampling-params must be a JSON object.")
        return value

    def watermark_settings(self) -> Optional[WatermarkSettings]:
        """The watermark policy (--enable-watermark, --watermark-config), None when off."""
        if not self.enable_watermark:
            if self.watermark_config is not None:
                raise ValueError("--watermark-config needs --enable-watermark.")
            return None
        if self.watermark_config is None:
            return WatermarkSettings()
        return WatermarkSettings.from_json(self.watermark_config)

    def allowlist(self) -> Optional[frozenset[str]]:
        return frozenset(self.custom_logit_processor_allowlist) if self.custom_logit_processor_allowlist else None

    @staticmethod
    def add_cli_args(parser: argparse.ArgumentParser) -> None:
        add_server_cli_args(parser, ServerArgs())

    @classmethod
    def from_cli_args(cls, args: argparse.Namespace) -> "ServerArgs":
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in vars(args).items() if k in names})


def _check_quantization_flag(value: Optional[str]) -> None:
    from sglang.srt.layers.quantization import check_quantization_flag

    check_quantization_flag(value)


def _default_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _default_detokenizer_mode(device: str) -> str:
    # On the CPU every process shares the cores the forward's OpenMP team spins on: a separate
    # detokenizer adds a process and a ZMQ hop (two I/O-thread wake-ups) to every streamed
    # token. On CUDA it keeps detokenization off the HTTP process's core.
    return "process" if device == "cuda" else "inline"


def _default_chunked_prefill_size(device: str) -> int:
    """SGLang's choice: 8192 tokens on a GPU of 80 GB or more, 4096 on a smaller one; 2048 on CPU."""
    if device != "cuda":
        return 2048
    import torch

    return 8192 if torch.cuda.get_device_properties(0).total_memory >= 70 * 2**30 else 4096


def default_attention_backend(device: str) -> str:
    return "triton" if device == "cuda" else "cpu"


def _default_sampling_backend(device: str) -> str:
    if device != "cuda":
        return "pytorch"
    import importlib.util

    for backend in ("triton", "flashinfer"):  # fastest first (docs/benchmarks.md, H100)
        if importlib.util.find_spec(backend) is not None:
            return backend
    return "pytorch"


def prepare_server_args(argv: Optional[list[str]] = None) -> ServerArgs:
    """Ours and every other SGLang flag parse (see server_args_compat); an unknown flag exits with
    the closest real one."""
    parser = argparse.ArgumentParser(
        prog="python -m sglang.launch_server", usage="%(prog)s [flags]",
        description="Our flags come first, by group; then SGLang's flags that parse without effect.",
    )
    ServerArgs.add_cli_args(parser)
    add_compat_args(parser)
    args = parse_args(parser, argv)
    server_args = ServerArgs.from_cli_args(args)
    server_args.ignored_flags = ignored_flags(args, parser)
    server_args.ignored_values = ignored_values(args)
    return server_args
