"""Structured-output (grammar) benchmark: what a grammar costs per decode step, per compile, and in serving.

Micro (per backend, xgrammar and llguidance; B = 1, 16, 64 grammar rows): a pool of 64 matchers of
one realistic JSON schema (`PROFILE_SCHEMA`: nested object, arrays, enums, integer bounds, string
patterns), matcher r advanced by a different number of tokens of one valid document (spread over
the whole document, so the pool holds 64 different states: inside keys, strings, numbers, enums,
between items). Each timed iteration takes the next B matchers of the pool, so B=1 and B=16 cycle
through every state and their medians are over states. Contenders, interleaved and rotated each
iteration like bench_sampler.py, every call on a fresh copy of fixed random [B, V] float32 logits
(randn * 3, copied outside the timed region):

  fill              `grammar_bitmask(reqs, V, device)`: the engine's per-step host fill of the packed
                    [B, ceil(V/32)] int32 bitmask (one batched library call per backend, threaded
                    only when the model is not on the CPU, as the engine does), with small fake
                    requests; on CUDA also the pinned allocation and the H2D copy
  apply             `apply_token_bitmask(logits, mask)`: the engine's choice for the device (bitmask.py:
                    the C kernel of sgl_kernel_ext on the CPU, xgrammar's Triton kernel on CUDA)
  apply_reference   `apply_token_bitmask_reference`: the plain torch definition
  sample            the no-grammar baseline: `info.apply_logits_bias(logits)` + `Sampler(...)`, the
                    engine's sampling step (T 0.7, top_k 50, top_p 0.9; the device's default
                    sampling backend), without a mask
  constrained_step  the same step as the engine runs it with grammar rows: fill, set
                    `info.vocab_mask`, `apply_logits_bias` (which applies the mask), `Sampler(...)`

Overhead = constrained_step / sample - 1. CPU times are perf_counter; CUDA times are CUDA events
around the call (the GPU idles while the host fills, so the events span the host work too), then a
synchronize.

Compile: every grammar of `COMPILE_GRAMMARS` (four JSON schemas and two regexes) compiled cold by
`backend.compile(key)` on the calling thread, i.e. what the compile thread runs (the backend's
per-key cache bypassed; xgrammar's compiler cache is disabled by the backend), `--compile-repeats`
times; also the time to the first mask (compile + new matcher + one row filled), because
llguidance builds parts of its parser lazily.

Tokenizer (`--tokenizer`):
  embedded   the embedded SmolLM2's tokenizer (V 49152; the default on the CPU). With a larger
             `--vocab` the backends pad it: the ids past the tokenizer are never allowed.
  synthetic  (the default on CUDA, where the machines have no internet and no model) a byte-level
             BPE tokenizer built in-process with the `tokenizers` library from `--vocab`
             deterministic byte strings (seed 0): the 256 single bytes, then ~60% lowercase letter
             runs of 2-12 bytes (half with a leading space, some capitalised), ~10% digit runs,
             ~10% runs of JSON punctuation and whitespace, ~20% CJK runs, and one EOS special
             token. It has no merges: the grammar libraries only read the token strings, and the
             benchmark's documents are tokenized by greedy longest match over the vocabulary.

Serving (`--serving`, CPU): the real server on the embedded model, launched once per backend
(`--grammar-backend`), 16 concurrent streamed requests of `max_new_tokens` 64 (`ignore_eos`), the
prompts of bench_serving.py with one JSON instruction appended and its mix of sampling parameters:
with `POINTS_SCHEMA` (an object holding an array of at least 12 small objects, so no document can
end before ~170 tokens and every request runs its 64 tokens) against the same requests without a
schema. After one untimed warm-up of each, `--serving-rounds` timed rounds of each, alternating
(C U, U C, C U, ...). Output tok/s = tokens / wall time of that mode's rounds; target: constrained
at least 0.85x unconstrained. Every record says how busy the machine was outside the benchmark
(OutsideLoad, as bench_serving.py).

Results: benchmark/results/grammar_<device>.json (header + records) and a plot beside it.

Usage:
  python benchmark/bench_grammar.py                          # CPU micro + compile (~1.5 min)
  python benchmark/bench_grammar.py --serving                # + the serving comparison (~4 min)
  python benchmark/bench_grammar.py --device cuda --vocab 151936   # GPU, no download needed
  (the GPU machines lack xgrammar, llguidance and pydantic: carry them as cp312 wheels and put
  python/, benchmark/ and the repo root on PYTHONPATH; docs/benchmarks.md has the call used)
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import random
import shlex
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable, Optional

import numpy as np
import torch
from tqdm import tqdm

from bench_sampler import machine_description, package_version  # this folder is on sys.path when run as a script
from sglang.srt.constrained.base_grammar_backend import GrammarKey
from sglang.srt.constrained.grammar_backends import create_grammar_backend
from sglang.srt.constrained.bitmask import (
    apply_token_bitmask,
    apply_token_bitmask_reference,
    bitmask_width,
    grammar_bitmask,
)
from sglang.srt.layers.logits_processor import LogitsProcessorOutput
from sglang.srt.layers.sampler import create_sampler
from sglang.srt.managers.schedule_batch import Req, ScheduleBatch
from sglang.srt.sampling.sampling_batch_info import SamplingBatchInfo
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang.srt.server_args import _default_sampling_backend

RESULTS_DIR = Path(__file__).resolve().parent / "results"
BACKENDS = ["xgrammar", "llguidance"]
POOL = 64  # matchers (distinct states) per backend
LOGIT_SCALE = 3.0  # as bench_sampler.py
SAMPLING = dict(temperature=0.7, top_k=50, top_p=0.9)
MEASURES = ["fill", "apply", "apply_reference", "sample", "constrained_step"]
SERVING_N, SERVING_NEW_TOKENS, SERVING_TARGET = 16, 64, 0.85

DEVICE_DEFAULTS = {
    "cpu": dict(vocab=49152, tokenizer="embedded", rounds=4, warmup=3, iters=128),
    "cuda": dict(vocab=151936, tokenizer="synthetic", rounds=4, warmup=5, iters=256),
}

# ------------------------------------------------------------------------------------- grammars

PROFILE_SCHEMA = {
    "type": "object",
    "properties": {
        "id": {"type": "integer", "minimum": 1, "maximum": 1000000},
        "name": {"type": "string", "minLength": 1, "maxLength": 64},
        "email": {"type": "string", "pattern": "^[a-z0-9._-]+@[a-z0-9-]+\\.[a-z]{2,6}$"},
        "status": {"enum": ["active", "suspended", "deleted", "pending"]},
        "age": {"type": "integer", "minimum": 13, "maximum": 120},
        "address": {
            "type": "object",
            "properties": {
                "street": {"type": "string", "maxLength": 80},
                "city": {"type": "string", "maxLength": 40},
                "postcode": {"type": "string", "pattern": "^[0-9]{5}$"},
                "country": {"enum": ["FR", "DE", "NL", "US", "JP"]},
            },
            "required": ["street", "city", "postcode", "country"],
            "additionalProperties": False,
        },
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 16}, "minItems": 1, "maxItems": 8},
        "orders": {
            "type": "array",
            "maxItems": 10,
            "items": {
                "type": "object",
                "properties": {
                    "sku": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{4}$"},
                    "quantity": {"type": "integer", "minimum": 1, "maximum": 99},
                    "price": {"type": "number", "minimum": 0},
                },
                "required": ["sku", "quantity", "price"],
                "additionalProperties": False,
            },
        },
    },
    "required": ["id", "name", "email", "status", "age", "address", "tags", "orders"],
    "additionalProperties": False,
}
PROFILE_DOCUMENT = {
    "id": 48213,
    "name": "Margarethe van der Linden",
    "email": "m.vanderlinden@example.nl",
    "status": "active",
    "age": 47,
    "address": {"street": "Prinsengracht 263", "city": "Amsterdam", "postcode": "10160", "country": "NL"},
    "tags": ["premium", "newsletter", "early-adopter"],
    "orders": [
        {"sku": "BKS-0042", "quantity": 2, "price": 18.5},
        {"sku": "TEA-1187", "quantity": 12, "price": 4.25},
    ],
}

# The serving schema: no document is shorter than ~170 tokens, so a request never ends before
# its 64 tokens (a grammar that accepts its stop token ends the request even with ignore_eos).
POINTS_SCHEMA = {
    "type": "object",
    "properties": {
        "points": {
            "type": "array",
            "minItems": 12,
            "maxItems": 40,
            "items": {
                "type": "object",
                "properties": {
                    "title": {"type": "string", "minLength": 3, "maxLength": 48},
                    "kind": {"enum": ["fact", "tip", "step", "idea", "example"]},
                    "score": {"type": "integer", "minimum": 1, "maximum": 10},
                },
                "required": ["title", "kind", "score"],
                "additionalProperties": False,
            },
        }
    },
    "required": ["points"],
    "additionalProperties": False,
}
JSON_INSTRUCTION = " Answer in JSON: at least twelve key points, each with a short title, a kind and a score from 1 to 10."

FLAT_SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}, "subscribed": {"type": "boolean"}},
    "required": ["name", "age", "subscribed"],
}
INVOICE_SCHEMA = {
    "$defs": {
        "address": {
            "type": "object",
            "properties": {"street": {"type": "string"}, "city": {"type": "string"}, "country": {"type": "string", "pattern": "^[A-Z]{2}$"}},
            "required": ["street", "city", "country"],
            "additionalProperties": False,
        },
        "line": {
            "type": "object",
            "properties": {
                "description": {"type": "string", "maxLength": 120},
                "quantity": {"type": "integer", "minimum": 1},
                "unit_price": {"type": "number", "minimum": 0},
                "vat": {"enum": [0, 9, 21]},
            },
            "required": ["description", "quantity", "unit_price", "vat"],
            "additionalProperties": False,
        },
        "card": {
            "type": "object",
            "properties": {"method": {"const": "card"}, "last4": {"type": "string", "pattern": "^[0-9]{4}$"}},
            "required": ["method", "last4"],
        },
        "transfer": {
            "type": "object",
            "properties": {"method": {"const": "transfer"}, "iban": {"type": "string", "pattern": "^[A-Z]{2}[0-9]{2}[A-Z0-9]{10,30}$"}},
            "required": ["method", "iban"],
        },
    },
    "type": "object",
    "properties": {
        "number": {"type": "string", "pattern": "^INV-[0-9]{6}$"},
        "date": {"type": "string", "format": "date"},
        "seller": {"$ref": "#/$defs/address"},
        "buyer": {"$ref": "#/$defs/address"},
        "lines": {"type": "array", "items": {"$ref": "#/$defs/line"}, "minItems": 1, "maxItems": 50},
        "payment": {"anyOf": [{"$ref": "#/$defs/card"}, {"$ref": "#/$defs/transfer"}]},
        "notes": {"anyOf": [{"type": "string"}, {"type": "null"}]},
    },
    "required": ["number", "date", "seller", "buyer", "lines", "payment"],
    "additionalProperties": False,
}
ISO_DATETIME_REGEX = r"\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])T([01]\d|2[0-3]):[0-5]\d:[0-5]\d(\.\d{1,6})?(Z|[+-]([01]\d|2[0-3]):[0-5]\d)"
PHONE_OR_EMAIL_REGEX = r"(\+[1-9]\d{0,2} ?)?(\(\d{1,4}\) ?)?\d{2,4}([ -]?\d{2,4}){2,3}|[a-zA-Z0-9._%+-]+@[a-zA-Z0-9.-]+\.[a-zA-Z]{2,10}"

COMPILE_GRAMMARS: dict[str, GrammarKey] = {
    "json:flat": GrammarKey("json_schema", json.dumps(FLAT_SCHEMA)),
    "json:profile": GrammarKey("json_schema", json.dumps(PROFILE_SCHEMA)),
    "json:points": GrammarKey("json_schema", json.dumps(POINTS_SCHEMA)),
    "json:invoice($defs,anyOf)": GrammarKey("json_schema", json.dumps(INVOICE_SCHEMA)),
    "regex:iso-datetime": GrammarKey("regex", ISO_DATETIME_REGEX),
    "regex:phone|email": GrammarKey("regex", PHONE_OR_EMAIL_REGEX),
}

# -------------------------------------------------------------------------------- tokenizers


@dataclass
class TokenizerSide:
    """What the grammar backends need: an HF tokenizer, V, the stop ids, and a way to tokenize a document."""

    hf: Any
    vocab_size: int
    stop_ids: list[int]
    encode: Callable[[str], list[int]]
    description: str


def gpt2_byte_to_unicode() -> dict[int, str]:
    """GPT-2's printable stand-ins for the 256 bytes (byte-level BPE vocabularies are written in them)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    chars = printable[:]
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return dict(zip(printable, map(chr, chars)))


def synthetic_token_bytes(count: int, seed: int = 0) -> list[bytes]:
    """`count` distinct byte strings: the 256 bytes, then the mix the module docstring describes."""
    rng = random.Random(seed)
    tokens = [bytes([b]) for b in range(256)]
    seen = set(tokens)
    letters, digits, punct = "abcdefghijklmnopqrstuvwxyz", "0123456789", ' {}[]":,.!?-_()\n\t\''
    while len(tokens) < count:
        kind = rng.random()
        length = rng.choice([2, 2, 3, 3, 4, 4, 5, 5, 6, 7, 8, 9, 10, 12])
        if kind < 0.6:
            word = "".join(rng.choice(letters) for _ in range(length))
            if rng.random() < 0.15:
                word = word.capitalize()
            if rng.random() < 0.5:
                word = " " + word
        elif kind < 0.7:
            word = "".join(rng.choice(digits) for _ in range(min(length, 4)))
        elif kind < 0.8:
            word = "".join(rng.choice(punct) for _ in range(min(length, 4)))
        else:
            word = "".join(chr(rng.randint(0x4E00, 0x9FFF)) for _ in range(max(1, length // 3)))
        raw = word.encode()
        if raw not in seen:
            seen.add(raw)
            tokens.append(raw)
    return tokens


def synthetic_tokenizer(vocab_size: int) -> TokenizerSide:
    """A byte-level BPE HF tokenizer of `vocab_size` ids (the last one EOS), built without any download."""
    from tokenizers import Tokenizer, decoders, models
    from tokenizers.pre_tokenizers import ByteLevel
    from transformers import PreTrainedTokenizerFast

    eos = "<|endoftext|>"
    token_bytes = synthetic_token_bytes(vocab_size - 1)
    to_unicode = gpt2_byte_to_unicode()
    vocab = {"".join(to_unicode[b] for b in raw): i for i, raw in enumerate(token_bytes)}
    vocab[eos] = len(vocab)
    model = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    model.pre_tokenizer = ByteLevel(add_prefix_space=False)
    model.decoder = decoders.ByteLevel()
    hf = PreTrainedTokenizerFast(tokenizer_object=model, eos_token=eos)
    ids = {raw: i for i, raw in enumerate(token_bytes)}
    longest = max(map(len, token_bytes))

    def encode(text: str) -> list[int]:  # greedy longest match: multi-byte tokens, as a real BPE gives
        raw, out, pos = text.encode(), [], 0
        while pos < len(raw):
            for size in range(min(longest, len(raw) - pos), 0, -1):
                token = ids.get(raw[pos : pos + size])
                if token is not None:
                    out.append(token)
                    pos += size
                    break
        return out

    desc = f"synthetic byte-level BPE, {vocab_size} ids (256 bytes + {vocab_size - 257} generated strings, seed 0, + EOS)"
    return TokenizerSide(hf, vocab_size, [vocab_size - 1], encode, desc)


def embedded_tokenizer(vocab_size: int) -> TokenizerSide:
    from sglang.srt.utils.embedded_model import embedded_model_path
    from sglang.srt.utils.hf_transformers_utils import get_tokenizer

    hf = get_tokenizer(embedded_model_path())
    if vocab_size < len(hf):
        raise ValueError(f"--vocab {vocab_size} is smaller than the embedded tokenizer's {len(hf)} ids")
    desc = f"embedded SmolLM2-135M-Instruct tokenizer ({len(hf)} ids)"
    if vocab_size > len(hf):
        desc += f", padded to {vocab_size} (the padding ids are never allowed)"
    return TokenizerSide(hf, vocab_size, [hf.eos_token_id], lambda text: hf.encode(text, add_special_tokens=False), desc)


# ------------------------------------------------------------------------------------- micro


@dataclass
class FakeReq:
    """The fields grammar_bitmask reads from a scheduler Req."""

    grammar: Any
    output_ids: list[int]
    stop_ids: frozenset
    sampling_params: Any = field(default_factory=lambda: SimpleNamespace(min_new_tokens=0))

    def finished(self) -> bool:
        return False

    def stop_token_ids(self) -> set[int]:
        return set(self.stop_ids)


def matcher_pool(backend: Any, side: TokenizerSide) -> tuple[list[FakeReq], int]:
    """POOL requests, each with its own matcher of PROFILE_SCHEMA advanced by a different number of
    tokens of PROFILE_DOCUMENT (spread from 1 to the document's end - 1); also the document's length."""
    compiled = backend.compile(GrammarKey("json_schema", json.dumps(PROFILE_SCHEMA)))
    tokens = side.encode(json.dumps(PROFILE_DOCUMENT))
    check = backend.new_matcher(compiled, side.stop_ids)
    for i, token in enumerate(tokens):  # the document must be valid, token by token
        if not check.accept_token(token):
            raise RuntimeError(f"{backend.name} rejects token {i} ({token}) of the profile document")
    reqs = []
    for r in range(POOL):
        advance = 1 + r * (len(tokens) - 2) // (POOL - 1)
        matcher = backend.new_matcher(compiled, side.stop_ids)
        for token in tokens[:advance]:
            matcher.accept_token(token)
        reqs.append(FakeReq(matcher, tokens[:advance], frozenset(side.stop_ids)))
    return reqs, len(tokens)


def allowed_counts(mask: torch.Tensor, vocab_size: int) -> list[int]:
    bits = np.unpackbits(mask.cpu().numpy().view(np.uint8), axis=1, bitorder="little")[:, :vocab_size]
    return bits.sum(axis=1).tolist()


def sampling_info(batch: int, vocab_size: int, device: torch.device) -> SamplingBatchInfo:
    reqs = [Req(f"r{i}", [1, 2, 3], SamplingParams(**SAMPLING)) for i in range(batch)]
    sched = ScheduleBatch(reqs=reqs, device=device)
    info = SamplingBatchInfo.from_schedule_batch(sched, vocab_size)
    sched.sampling_info = info
    info._keepalive = sched  # the orchestrator holds the batch only weakly
    return info


Step = Callable[[torch.Tensor, int], object]  # (fresh logits copy, group index)


@dataclass
class MicroBench:
    backend: str
    batch: int
    logits: torch.Tensor  # [B, V], never mutated
    steps: dict[str, Step]
    groups: int
    samples: dict[str, list[float]]
    allowed: list[int]  # allowed-token count of each row of every group's mask
    cursor: int = 0  # the group of the next timed iteration (over all rounds, so every state gets its turn)


def build_micro(backend_name: str, reqs: list[FakeReq], batch: int, vocab: int, device: torch.device, sampler: Any) -> MicroBench:
    groups = [[reqs[(g * batch + j) % POOL] for j in range(batch)] for g in range(max(1, POOL // batch))]
    masks = [grammar_bitmask(group, vocab, device) for group in groups]
    allowed = [n for mask in masks for n in allowed_counts(mask, vocab)]
    info = sampling_info(batch, vocab, device)
    positions = torch.zeros(batch, dtype=torch.int64, device=device)
    gen = torch.Generator().manual_seed(batch * 7919 + vocab)
    logits = (torch.randn(batch, vocab, generator=gen) * LOGIT_SCALE).to(device)

    def sample(buf: torch.Tensor, g: int) -> torch.Tensor:
        info.apply_logits_bias(buf)
        return sampler(LogitsProcessorOutput(next_token_logits=buf), info, positions=positions)

    def constrained(buf: torch.Tensor, g: int) -> torch.Tensor:
        info.vocab_mask = grammar_bitmask(groups[g], vocab, device)
        try:
            info.apply_logits_bias(buf)
        finally:
            info.vocab_mask = None
        return sampler(LogitsProcessorOutput(next_token_logits=buf), info, positions=positions)

    steps: dict[str, Step] = {
        "fill": lambda buf, g: grammar_bitmask(groups[g], vocab, device),
        "apply": lambda buf, g: apply_token_bitmask(buf, masks[g]),
        "apply_reference": lambda buf, g: apply_token_bitmask_reference(buf, masks[g]),
        "sample": sample,
        "constrained_step": constrained,
    }
    return MicroBench(backend_name, batch, logits, steps, len(groups), {name: [] for name in steps}, allowed)


def time_cpu_us(step: Step, buf: torch.Tensor, g: int) -> float:
    start = time.perf_counter_ns()
    step(buf, g)
    return (time.perf_counter_ns() - start) / 1e3


def time_cuda_us(step: Step, buf: torch.Tensor, g: int) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    step(buf, g)
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3


def measure(bench: MicroBench, warmup: int, iters: int, bar: tqdm) -> None:
    timer = time_cuda_us if bench.logits.is_cuda else time_cpu_us
    buf = torch.empty_like(bench.logits)
    names = list(bench.steps)
    for it in range(warmup + iters):
        g = bench.cursor % bench.groups  # warm-up iterations repeat the first timed group
        if it >= warmup:
            bench.cursor += 1
        shift = it % len(names)
        for name in names[shift:] + names[:shift]:
            buf.copy_(bench.logits)
            if buf.is_cuda:
                torch.cuda.synchronize()
            elapsed = timer(bench.steps[name], buf, g)
            if it >= warmup:
                bench.samples[name].append(elapsed)
        bar.update(1)


def run_micro(args: argparse.Namespace, backends: dict[str, Any], side: TokenizerSide, device: torch.device) -> tuple[list[dict], dict]:
    sampler = create_sampler(args.sampling_backend)
    benches, doc_tokens = [], {}
    for name, backend in backends.items():
        reqs, doc_tokens[name] = matcher_pool(backend, side)
        benches += [build_micro(name, reqs, b, side.vocab_size, device, sampler) for b in args.batch_sizes]
    per_round = math.ceil(args.iters / args.rounds)
    if (per_round * args.rounds) % POOL:
        print(f"note: {per_round * args.rounds} timed iterations are not a multiple of {POOL}: B=1 samples some states more often")
    with tqdm(total=args.rounds * len(benches) * (args.warmup + per_round), unit="it") as bar:
        for round_no in range(args.rounds):  # every configuration each round: outside bursts hit all alike
            for bench in benches:
                bar.set_description(f"micro round {round_no + 1}/{args.rounds} {bench.backend} B={bench.batch}")
                measure(bench, args.warmup, per_round, bar)
    records = []
    for bench in benches:
        for name, values in bench.samples.items():
            records.append(
                dict(
                    part="micro", device=device.type, backend=bench.backend, B=bench.batch, V=side.vocab_size,
                    measure=name, median_us=round(statistics.median(values), 2), mean_us=round(statistics.fmean(values), 2),
                    p90_us=round(sorted(values)[int(0.9 * (len(values) - 1))], 2), samples=len(values),
                )
            )
        records.append(
            dict(
                part="mask", device=device.type, backend=bench.backend, B=bench.batch, V=side.vocab_size,
                allowed_mean=round(statistics.fmean(bench.allowed), 1), allowed_min=min(bench.allowed),
                allowed_max=max(bench.allowed), states=len(bench.allowed),
            )
        )
    return records, {"profile_document_tokens": doc_tokens, "pool": POOL, "sampling": SAMPLING, "sampling_backend": args.sampling_backend}


def run_compile(args: argparse.Namespace, backends: dict[str, Any], side: TokenizerSide) -> list[dict]:
    records = []
    width = bitmask_width(side.vocab_size)
    with tqdm(total=len(backends) * len(COMPILE_GRAMMARS) * args.compile_repeats, desc="compile", unit="compile") as bar:
        for name, backend in backends.items():
            for label, key in COMPILE_GRAMMARS.items():
                compile_ms, first_mask_ms = [], []
                for _ in range(args.compile_repeats):
                    host = torch.full((1, width), -1, dtype=torch.int32)
                    t0 = time.perf_counter()
                    compiled = backend.compile(key)  # cold: the backend's cache is compile_async's, bypassed
                    t1 = time.perf_counter()
                    backend.new_matcher(compiled, side.stop_ids).fill_vocab_mask(host, 0)
                    t2 = time.perf_counter()
                    compile_ms.append((t1 - t0) * 1e3)
                    first_mask_ms.append((t2 - t0) * 1e3)
                    bar.update(1)
                records.append(
                    dict(
                        part="compile", backend=name, V=side.vocab_size, grammar=label, kind=key.kind, chars=len(key.text),
                        compile_ms_median=round(statistics.median(compile_ms), 3),
                        first_mask_ms_median=round(statistics.median(first_mask_ms), 3),
                        compile_ms_max=round(max(compile_ms), 3), repeats=args.compile_repeats,
                    )
                )
    return records


# ----------------------------------------------------------------------------------- serving


def serving_payload(i: int, constrained: bool) -> dict:
    from bench_serving import PROMPTS, SAMPLING as SERVING_SAMPLING

    params = {**SERVING_SAMPLING[i % len(SERVING_SAMPLING)], "max_new_tokens": SERVING_NEW_TOKENS, "ignore_eos": True}
    if constrained:
        params["json_schema"] = json.dumps(POINTS_SCHEMA)
    return {"text": PROMPTS[i % len(PROMPTS)] + JSON_INSTRUCTION, "sampling_params": params, "stream": True}


def serving_round(url: str, constrained: bool, bar: Optional[tqdm]) -> tuple[list, float]:
    """SERVING_N streamed requests released together; (timings, wall s)."""
    from bench_serving import run_streams

    return run_streams(url, [serving_payload(i, constrained) for i in range(SERVING_N)], bar)


def sample_output(url: str) -> str:
    """One constrained request's text, non-streamed: shows the schema is enforced."""
    import requests

    payload = serving_payload(0, True)
    payload["stream"] = False
    response = requests.post(url + "/generate", json=payload, timeout=600)
    response.raise_for_status()
    return response.json()["text"]


def bench_serving_backend(backend: str, rounds: int) -> tuple[list[dict], dict]:
    from bench_serving import OutsideLoad, record
    from sglang.test.server_process import ServerProcess, free_port

    port = free_port()
    print(f"starting the server on port {port} --grammar-backend {backend} ...", flush=True)
    server = ServerProcess(["--port", str(port), "--log-level", "warning", "--grammar-backend", backend], port, startup_timeout=600)
    try:
        server.wait_healthy()
        t0 = time.perf_counter()
        serving_round(server.url, True, None)  # warm-up; the first constrained request also compiles the schema
        warmup_constrained_s = time.perf_counter() - t0
        serving_round(server.url, False, None)
        pooled = {True: dict(timings=[], wall=0.0, outside=0.0, per_round=[]), False: dict(timings=[], wall=0.0, outside=0.0, per_round=[])}
        with tqdm(total=2 * rounds * SERVING_N, desc=f"serving {backend}", unit="req") as bar:
            for r in range(rounds):
                for constrained in ((True, False) if r % 2 == 0 else (False, True)):
                    with OutsideLoad() as outside:
                        timings, wall = serving_round(server.url, constrained, bar)
                    acc = pooled[constrained]
                    acc["timings"] += timings
                    acc["wall"] += wall
                    acc["outside"] += outside.cpu_s
                    acc["per_round"].append(round(sum(t.tokens for t in timings) / wall, 2))
        text = sample_output(server.url)
    finally:
        server.stop()
    records = []
    for constrained, acc in pooled.items():
        timings = acc["timings"]
        itl = [gap for t in timings for gap in t.itl_s]
        rec = record(f"{backend}:{'json_schema' if constrained else 'unconstrained'}", SERVING_N, [t.ttft_s for t in timings],
                     itl, sum(t.tokens for t in timings), acc["wall"], rounds, acc["outside"])
        rec.update(part="serving", backend=backend, mode="json_schema" if constrained else "unconstrained",
                   tok_s_per_round=acc["per_round"], short_requests=sum(t.tokens != SERVING_NEW_TOKENS for t in timings))
        records.append(rec)
    extra = {"warmup_constrained_round_s": round(warmup_constrained_s, 2), "sample_output": text[:400]}
    return records, extra


# ------------------------------------------------------------------------------------ output


def fmt_us(us: float) -> str:
    return f"{us:,.0f}" if us >= 100 else f"{us:.3g}"


def micro_table(records: list[dict]) -> str:
    """One row per (backend, B): medians, and for the grammar pieces also means (over the pool's
    states, a document's average: xgrammar's cost depends strongly on the state)."""
    stat = {(r["backend"], r["B"], r["measure"]): r for r in records if r["part"] == "micro"}
    masks = {(r["backend"], r["B"]): r for r in records if r["part"] == "mask"}
    configs = list(dict.fromkeys((r["backend"], r["B"], r["V"]) for r in records if r["part"] == "micro"))
    lines = [
        "| backend | V | B | fill µs median / mean | apply µs | apply_reference µs | sample (no grammar) µs median / mean "
        "| constrained step µs median / mean | overhead median / mean | allowed tokens mean (min-max) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for backend, b, v in configs:
        m = {name: stat[(backend, b, name)] for name in MEASURES}
        both = lambda name: f"{fmt_us(m[name]['median_us'])} / {fmt_us(m[name]['mean_us'])}"  # noqa: E731
        over = [100 * (m["constrained_step"][k] / m["sample"][k] - 1) for k in ("median_us", "mean_us")]
        mask = masks.get((backend, b))
        allowed = f"{mask['allowed_mean']:,.0f} ({mask['allowed_min']:,}-{mask['allowed_max']:,})" if mask else "—"
        lines.append(
            f"| {backend} | {v} | {b} | {both('fill')} | {fmt_us(m['apply']['median_us'])} | {fmt_us(m['apply_reference']['median_us'])} | "
            f"{both('sample')} | {both('constrained_step')} | {over[0]:+.0f}% / {over[1]:+.0f}% | {allowed} |"
        )
    return "\n".join(lines)


def compile_table(records: list[dict]) -> str:
    comp = [r for r in records if r["part"] == "compile"]
    backends = list(dict.fromkeys(r["backend"] for r in comp))
    by = {(r["grammar"], r["backend"]): r for r in comp}
    head = " | ".join(f"{b} compile ms | {b} first mask ms" for b in backends)
    lines = [f"| grammar | chars | {head} |", "|---|---|" + "---|" * (2 * len(backends))]
    for grammar in dict.fromkeys(r["grammar"] for r in comp):
        cells = []
        for b in backends:
            r = by.get((grammar, b))
            cells += [f"{r['compile_ms_median']:.1f}", f"{r['first_mask_ms_median']:.1f}"] if r else ["—", "—"]
        chars = next(r["chars"] for r in comp if r["grammar"] == grammar)
        lines.append(f"| {grammar} | {chars} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def serving_ratios(records: list[dict]) -> dict[str, float]:
    by = {(r["backend"], r["mode"]): r["output_tok_s"] for r in records if r["part"] == "serving"}
    return {b: by[(b, "json_schema")] / by[(b, "unconstrained")] for (b, m) in by if m == "json_schema" and (b, "unconstrained") in by}


def serving_table(records: list[dict]) -> str:
    ratio = serving_ratios(records)
    lines = [
        "| backend | requests | output tok/s | per round | constrained / unconstrained | TTFT median ms | ITL median ms | ITL p90 ms | tokens | short requests | wall s | outside load (cores) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in (r for r in records if r["part"] == "serving"):
        share = f"{ratio[r['backend']]:.3f}x" if r["mode"] == "json_schema" and r["backend"] in ratio else ""
        rounds = ", ".join(f"{x:.0f}" for x in r["tok_s_per_round"])
        lines.append(
            f"| {r['backend']} | {r['mode']} | {r['output_tok_s']:.1f} | {rounds} | {share} | {r['ttft_ms_median']:.0f} | "
            f"{r['itl_ms_median']:.1f} | {r['itl_ms_p90']:.1f} | {r['total_tokens']} | {r['short_requests']} | {r['wall_s']:.1f} | {r['outside_load_cores']:.2f} |"
        )
    return "\n".join(lines)


def serving_verdict(records: list[dict]) -> list[str]:
    return [
        f"serving target ({backend}): json_schema at least {SERVING_TARGET:g}x unconstrained output tok/s -> "
        f"{ratio:.3f}x: {'MET' if ratio >= SERVING_TARGET else 'NOT MET'}"
        for backend, ratio in serving_ratios(records).items()
    ]


def plot(records: list[dict], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    micro = [r for r in records if r["part"] == "micro"]
    comp = [r for r in records if r["part"] == "compile"]
    serving = [r for r in records if r["part"] == "serving"]
    panels = 2 * bool(micro) + bool(comp) + bool(serving)
    if not panels:
        return
    fig, axes = plt.subplots(1, panels, figsize=(5 * panels, 4.2), squeeze=False)
    axes = list(axes.flat)
    backends = list(dict.fromkeys(r["backend"] for r in micro + comp))
    styles = {"fill": ("-", "o"), "apply": ("--", "s"), "apply_reference": (":", "^"), "sample": ("-.", "x")}
    for color, backend in enumerate(backends):
        for measure, (style, marker) in styles.items():
            if measure == "sample" and color > 0:
                continue  # the baseline is the same step for every backend
            points = sorted((r["B"], r["mean_us"]) for r in micro if r["backend"] == backend and r["measure"] == measure)
            label = "sample (no grammar)" if measure == "sample" else f"{backend} {measure}"
            axes[0].plot(*zip(*points), style, marker=marker, color="k" if measure == "sample" else f"C{color}", label=label)
        med = {(r["B"], r["measure"]): r["mean_us"] for r in micro if r["backend"] == backend}
        batches = sorted({b for b, _ in med})
        axes[1].plot(batches, [med[(b, "constrained_step")] / med[(b, "sample")] for b in batches], marker="o", color=f"C{color}", label=backend)
    k = 0
    if micro:
        axes[0].set(xscale="log", yscale="log", xlabel="B (grammar rows)", ylabel="mean µs per step (over the pool's states)", title="per-step pieces")
        axes[1].set(xscale="log", yscale="log", xlabel="B (grammar rows)", ylabel="constrained / sample", title="constrained step / sample (means)")
        axes[1].axhline(1, color="k", lw=0.5)
        axes[1].yaxis.set_major_locator(matplotlib.ticker.LogLocator(base=10, subs=(1.0, 1.5, 2.0, 3.0, 5.0)))
        axes[1].yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}x"))
        axes[1].yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        k = 2
    if comp:
        grammars = list(dict.fromkeys(r["grammar"] for r in comp))
        width = 0.8 / len(backends)
        for color, backend in enumerate(backends):
            by = {r["grammar"]: r["first_mask_ms_median"] for r in comp if r["backend"] == backend}
            xs = [i + (color - (len(backends) - 1) / 2) * width for i in range(len(grammars))]
            axes[k].bar(xs, [by.get(g, 0) for g in grammars], width, color=f"C{color}", label=backend)
        axes[k].set(xticks=range(len(grammars)), ylabel="ms (median, cold)", title="compile + first mask", yscale="log")
        axes[k].set_xticklabels(grammars, rotation=30, ha="right", fontsize=7)
        k += 1
    if serving:
        sbackends = list(dict.fromkeys(r["backend"] for r in serving))
        by = {(r["backend"], r["mode"]): r["output_tok_s"] for r in serving}
        for j, mode in enumerate(("unconstrained", "json_schema")):
            xs = [i + (j - 0.5) * 0.4 for i in range(len(sbackends))]
            axes[k].bar(xs, [by.get((b, mode), 0) for b in sbackends], 0.4, color="C7" if j == 0 else "C2", label=mode)
        for i, b in enumerate(sbackends):
            if (b, "unconstrained") in by and (b, "json_schema") in by:
                axes[k].annotate(f"{by[(b, 'json_schema')] / by[(b, 'unconstrained')]:.2f}x", (i + 0.2, by[(b, "json_schema")]), ha="center", va="bottom", fontsize=8)
                axes[k].hlines(SERVING_TARGET * by[(b, "unconstrained")], i, i + 0.4, colors="k", linestyles="--")
        axes[k].set(xticks=range(len(sbackends)), xticklabels=sbackends, ylabel="output tok/s",
                    title=f"serving, {SERVING_N} x {SERVING_NEW_TOKENS} tokens (-- {SERVING_TARGET:g}x)")
    for ax in axes:
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# -------------------------------------------------------------------------------------- main


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu", choices=sorted(DEVICE_DEFAULTS))
    parser.add_argument("--vocab", type=int, help="V (default: 49152 on the CPU, 151936 on CUDA)")
    parser.add_argument("--tokenizer", choices=["embedded", "synthetic"], help="(default: embedded on the CPU, synthetic on CUDA)")
    parser.add_argument("--backends", nargs="+", default=BACKENDS, choices=BACKENDS)
    parser.add_argument("--batch-sizes", nargs="+", type=int, default=[1, 16, 64])
    parser.add_argument("--sampling-backend", help="the baseline Sampler's backend (default: the server's default for the device)")
    parser.add_argument("--rounds", type=int, help="passes over all micro configurations")
    parser.add_argument("--warmup", type=int, help="untimed micro iterations per configuration and round")
    parser.add_argument("--iters", type=int, help="timed micro iterations per configuration, over all rounds")
    parser.add_argument("--compile-repeats", type=int, default=3, help="cold compiles per grammar and backend")
    parser.add_argument("--no-micro", action="store_true", help="skip the per-step and compile timings")
    parser.add_argument("--serving", action="store_true", help="also the serving comparison (CPU, embedded model)")
    parser.add_argument("--serving-rounds", type=int, default=3, help="timed rounds per mode and backend (default 3)")
    parser.add_argument("--out-dir", type=Path, default=RESULTS_DIR)
    args = parser.parse_args()
    for key, value in DEVICE_DEFAULTS[args.device].items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.sampling_backend is None:
        args.sampling_backend = _default_sampling_backend(args.device)
    if args.serving and args.device != "cpu":
        parser.error("--serving launches the embedded model on the CPU; run it with --device cpu")
    if any(b < 1 or b > POOL for b in args.batch_sizes):
        parser.error(f"--batch-sizes must be within 1..{POOL}")
    return args


def main() -> None:
    args = parse_args()
    from bench_serving import git_revision

    started = datetime.datetime.now(datetime.timezone.utc)
    device = torch.device(args.device)
    records: list[dict] = []
    head: dict[str, Any] = {
        "date": started.isoformat(timespec="seconds"),
        "machine": machine_description(device),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "xgrammar": package_version("xgrammar"),
        "llguidance": package_version("llguidance"),
        "command": shlex.join([Path(sys.executable).name, *sys.argv]),
        "git": git_revision(),
    }
    if not args.no_micro:
        print(f"building the tokenizer side ({args.tokenizer}, V {args.vocab}) ...", flush=True)
        side = synthetic_tokenizer(args.vocab) if args.tokenizer == "synthetic" else embedded_tokenizer(args.vocab)
        head["tokenizer"] = side.description
        backends = {}
        for name in args.backends:
            t0 = time.perf_counter()
            backends[name] = create_grammar_backend(name, side.hf, side.vocab_size, side.stop_ids)
            head[f"{name}_tokenizer_init_s"] = round(time.perf_counter() - t0, 2)
        from bench_serving import OutsideLoad

        t0 = time.perf_counter()
        with OutsideLoad() as outside:  # the shared machine's other work, as for serving
            micro, head["micro"] = run_micro(args, backends, side, device)
            records += micro + run_compile(args, backends, side)
        head["micro"]["outside_load_cores"] = round(outside.cpu_s / (time.perf_counter() - t0), 3)
        for backend in backends.values():
            backend.shutdown()
    if args.serving:
        head["serving"] = {
            "server": "launched: python -m sglang.launch_server --grammar-backend <backend> (otherwise default flags, embedded model)",
            "requests": SERVING_N, "new_tokens": SERVING_NEW_TOKENS, "schema": POINTS_SCHEMA,
            "json_instruction": JSON_INSTRUCTION, "rounds": args.serving_rounds,
        }
        for backend in args.backends:
            serving, head["serving"][backend] = bench_serving_backend(backend, args.serving_rounds)
            records += serving
    head["elapsed_s"] = round((datetime.datetime.now(datetime.timezone.utc) - started).total_seconds(), 1)

    args.out_dir.mkdir(parents=True, exist_ok=True)
    json_path = args.out_dir / f"grammar_{device.type}.json"
    json_path.write_text(json.dumps({"header": head, "records": records}, indent=1) + "\n")
    if records:
        plot(records, json_path.with_suffix(".png"), f"Grammar cost, {head['machine']}, torch {head['torch']}")
    print(f"\n{head['date']} | {head['machine']} | torch {head['torch']} ({head['torch_threads']} threads) | git {head['git']}")
    print(f"command: {head['command']}")
    if "tokenizer" in head:
        print(f"tokenizer: {head['tokenizer']}; baseline sampler: {args.sampling_backend}; "
              f"outside load during micro + compile: {head['micro']['outside_load_cores']:.2f} cores\n")
        print(micro_table(records) + "\n")
        print(compile_table(records) + "\n")
    if args.serving:
        print(serving_table(records))
        print("\n".join(serving_verdict(records)))
        for backend in args.backends:
            print(f"{backend} sample output: {head['serving'][backend]['sample_output'][:200]!r}")
    print(f"wrote {json_path}" + (f" and {json_path.with_suffix('.png')}" if json_path.with_suffix(".png").exists() else ""))


if __name__ == "__main__":
    main()
