"""Model runner: logits vs transformers (GGUF and safetensors), paged-KV consistency, tokenizer, config."""

from __future__ import annotations

import json
import os
import time

import pytest
import torch

from sglang.srt.configs.model_config import ModelConfig
from sglang.srt.layers import linear
from sglang.srt.mem_cache.memory_pool import ReqToTokenPool, TokenToKVPoolAllocator
from sglang.srt.model_executor.model_runner import ModelRunner
from sglang.srt.utils import available_ram_bytes, hf_transformers_utils

from runner_utils import Driver

transformers = pytest.importorskip("transformers")

# fp32 throughout. Our CPU linears run on oneDNN and transformers' on MKL: the different summation
# order moves the 30-layer model's logits (|x| up to ~30) by ~2e-4, and batching or chunking (other
# matmul shapes) by as much. Real bugs (mask, positions, slots) move them by O(1).
LOGIT_ATOL = 1e-3
TINY_ATOL = 1e-5
PROMPTS = [
    [19556, 905, 28, 638, 359, 346, 47],  # "Hello world, how are you?"
    torch.randint(0, 49152, (41,), generator=torch.Generator().manual_seed(0)).tolist(),
    torch.randint(0, 49152, (23,), generator=torch.Generator().manual_seed(1)).tolist(),
]


@pytest.fixture(scope="module")
def runner(gguf_path: str) -> ModelRunner:
    return ModelRunner(gguf_path, max_total_tokens=2048, max_running_requests=8)


@pytest.fixture(scope="module")
def hf_model(gguf_path: str):
    pytest.importorskip("accelerate", reason="transformers needs accelerate to load a GGUF file")
    folder, name = os.path.split(gguf_path)
    return transformers.AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32).eval()


@pytest.fixture
def driver(runner: ModelRunner):
    d = Driver(runner)
    yield d
    d.release()


def full_forward_logits(driver: Driver, ids: list[int]) -> torch.Tensor:
    """[len(ids), V] logits of every position from one-shot prefill."""
    return driver.extend([driver.new_req()], [ids], input_logits=True).input_token_logits


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a - b).abs().max().item()


# --- the embedded GGUF model against transformers -------------------------------------------


def test_gguf_logits_match_transformers(driver: Driver, hf_model) -> None:
    reqs = [driver.new_req() for _ in PROMPTS]
    out = driver.extend(reqs, PROMPTS, input_logits=True)
    rows = out.input_token_logits.split([len(p) for p in PROMPTS])
    diffs = []
    for i, prompt in enumerate(PROMPTS):
        with torch.no_grad():
            ref = hf_model(torch.tensor([prompt])).logits[0].float()  # [n, V]
        diffs.append(max_diff(rows[i], ref))
        assert torch.equal(out.next_token_logits[i], rows[i][-1])
    print(f"max |ours - transformers| per prompt: {diffs}")
    assert max(diffs) < LOGIT_ATOL
    assert out.next_token_logits.shape == (len(PROMPTS), 49152) and out.next_token_logits.dtype == torch.float32


def test_next_token_logits_only_by_default(driver: Driver) -> None:
    out = driver.extend([driver.new_req(), driver.new_req()], PROMPTS[:2])
    assert out.input_token_logits is None
    assert out.next_token_logits.shape == (2, 49152)


# --- paged KV: chunking, decoding and batching give the one-shot numbers --------------------


def test_chunked_prefill_then_decode_matches_one_shot(driver: Driver) -> None:
    prompt = PROMPTS[1]
    req = driver.new_req()
    chunk_logits = [
        driver.extend([req], [prompt[a:b]], input_logits=True).input_token_logits
        for a, b in [(0, 15), (15, 32), (32, len(prompt))]
    ]
    tokens, decode_logits = [], []
    token = int(chunk_logits[-1][-1].argmax())
    for _ in range(5):
        tokens.append(token)
        logits = driver.decode([req], [token])[0]
        decode_logits.append(logits)
        token = int(logits.argmax())

    full = full_forward_logits(driver, prompt + tokens)
    n = len(prompt)
    diffs = max_diff(torch.cat(chunk_logits), full[:n]), max_diff(torch.stack(decode_logits), full[n:])
    print(f"chunked prefill / decode vs one-shot: {diffs}")
    assert max(diffs) < LOGIT_ATOL


def test_batched_decode_equals_each_request_alone(driver: Driver) -> None:
    prompts = [PROMPTS[0], PROMPTS[1][:30], PROMPTS[2][:3]]
    batch = [driver.new_req() for _ in prompts]
    tokens = [driver.extend(batch, prompts).next_token_logits.argmax(-1).tolist()]  # per step, per request
    batched = []
    for step in range(4):
        batched.append(driver.decode(batch, tokens[step]))  # [3, V]
        tokens.append(batched[-1].argmax(-1).tolist())

    diffs = []
    for i, prompt in enumerate(prompts):
        req = driver.new_req()
        driver.extend([req], [prompt])
        for step in range(4):  # the same tokens as the batched run, so only batching differs
            diffs.append(max_diff(driver.decode([req], [tokens[step][i]])[0], batched[step][i]))
    print(f"batched vs alone decode: {max(diffs):.2e}")
    assert max(diffs) < LOGIT_ATOL


# Greedy continuations of PROMPTS (prefill, then 15 decode steps of the three as one batch) on
# the exact path: the GGUF's own weights, float32 sums. A kernel change that alters more than
# the order of sums shows here first.
GREEDY_TOKENS = [
    [339, 5248, 1535, 288, 724, 346, 351, 469, 1861, 28, 284, 339, 5248, 1535, 288, 724],
    [253, 283, 1433, 282, 34789, 281, 260, 1512, 28, 253, 283, 1433, 282, 34789, 281, 260],
    [4605, 50, 4272, 30, 198, 198, 1780, 314, 260, 768, 5161, 970, 288, 5125, 260, 768],
]


def test_greedy_output_is_pinned(driver: Driver) -> None:
    reqs = [driver.new_req() for _ in PROMPTS]
    steps = [driver.extend(reqs, PROMPTS).next_token_logits.argmax(-1).tolist()]
    for _ in range(len(GREEDY_TOKENS[0]) - 1):
        steps.append(driver.decode(reqs, steps[-1]).argmax(-1).tolist())
    assert [list(row) for row in zip(*steps)] == GREEDY_TOKENS


def test_mixed_prefix_extend_batch(driver: Driver) -> None:
    """One extend batch where one request continues a cached prefix and another starts fresh."""
    a, b = driver.new_req(), driver.new_req()
    driver.extend([a], [PROMPTS[1][:20]])
    out = driver.extend([a, b], [PROMPTS[1][20:], PROMPTS[2]], input_logits=True)
    got_a, got_b = out.input_token_logits.split([len(PROMPTS[1]) - 20, len(PROMPTS[2])])
    assert max_diff(got_a, full_forward_logits(driver, PROMPTS[1])[20:]) < LOGIT_ATOL
    assert max_diff(got_b, full_forward_logits(driver, PROMPTS[2])) < LOGIT_ATOL


def test_runner_attributes(runner: ModelRunner) -> None:
    assert runner.max_total_num_tokens == 2048
    assert runner.vocab_size == 49152 and runner.device == torch.device("cpu")
    k, v = runner.kv_cache.get_kv(0)
    assert k.shape == v.shape == (2050, 3, 64) and k.dtype == torch.float32  # slot 0 and the padding write slot
    assert runner.req_to_token_pool.req_to_token.shape[1] == runner.model_config.context_len
    qkv = runner.model.model.layers[0].self_attn.qkv_proj
    assert qkv.weight.is_mkldnn == linear.cpu_pack_supported(torch.empty(1))


# --- tiny random safetensors checkpoints of each architecture --------------------------------

TINY = dict(vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=128)
TINY_CASES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {}),
    "llama_rope_llama3": ("LlamaConfig", "LlamaForCausalLM", dict(
        rope_theta=500000.0, rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0,
                                               high_freq_factor=4.0, original_max_position_embeddings=16))),
    "llama_rope_linear": ("LlamaConfig", "LlamaForCausalLM", dict(rope_scaling=dict(rope_type="linear", factor=2.0))),
    "qwen2_tied": ("Qwen2Config", "Qwen2ForCausalLM", dict(tie_word_embeddings=True)),
    "qwen3_head_dim_32_sharded": ("Qwen3Config", "Qwen3ForCausalLM", dict(head_dim=32)),
}


def _save_tiny(case: str, folder: str):
    config_cls, model_cls, extra = TINY_CASES[case]
    config = getattr(transformers, config_cls)(**TINY, **extra)
    torch.manual_seed(0)
    model = getattr(transformers, model_cls)(config).eval()
    # Default init leaves biases at 0 and norms at 1, which would hide loading mistakes.
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.2)
    shard = "40KB" if case.endswith("sharded") else "100MB"
    model.save_pretrained(folder, safe_serialization=True, max_shard_size=shard)
    return model


def _tiny_logits_diff(case: str, folder: str) -> tuple[ModelRunner, float]:
    """Prefill 40 tokens then decode 30 (past the llama3 cut-off too) through our runner."""
    ref_model = _save_tiny(case, folder)
    runner = ModelRunner(folder, max_total_tokens=256, max_running_requests=2)
    driver = Driver(runner)
    prompt = torch.randint(0, 300, (70,), generator=torch.Generator().manual_seed(2)).tolist()
    req = driver.new_req()
    ours = [driver.extend([req], [prompt[:40]], input_logits=True).input_token_logits]
    ours += [driver.decode([req], [t]) for t in prompt[40:]]
    with torch.no_grad():
        ref = ref_model(torch.tensor([prompt])).logits[0]
    return runner, max_diff(torch.cat(ours), ref)


@pytest.mark.parametrize("case", list(TINY_CASES))
def test_safetensors_tiny_models_match_transformers(case: str, tmp_path) -> None:
    _, diff = _tiny_logits_diff(case, str(tmp_path))
    if case.endswith("sharded"):
        assert os.path.exists(tmp_path / "model.safetensors.index.json")
    print(f"{case}: max |ours - transformers| = {diff:.2e}")
    assert diff < TINY_ATOL


def test_dense_linear_fallback(tmp_path, monkeypatch) -> None:
    """Where oneDNN packing is unavailable (or on CUDA) the linears use F.linear."""
    monkeypatch.setattr(linear, "cpu_pack_supported", lambda weight: False)
    runner, diff = _tiny_logits_diff("qwen3_head_dim_32_sharded", str(tmp_path))
    assert not runner.model.model.layers[0].mlp.down_proj.weight.is_mkldnn
    assert diff < TINY_ATOL


# --- tokenizer -------------------------------------------------------------------------------


def test_gguf_tokenizer_cached(gguf_path: str, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv(hf_transformers_utils.CACHE_ENV, str(tmp_path))
    start = time.perf_counter()
    converted = hf_transformers_utils.get_tokenizer(gguf_path)  # transformers' own GGUF conversion
    convert_s = time.perf_counter() - start
    cache_dir = hf_transformers_utils.gguf_tokenizer_cache_dir(gguf_path)
    assert cache_dir.startswith(str(tmp_path)) and os.path.isdir(cache_dir)
    start = time.perf_counter()
    cached = hf_transformers_utils.get_tokenizer(gguf_path)
    cached_s = time.perf_counter() - start
    print(f"tokenizer: convert {convert_s:.2f}s, cached load {cached_s:.2f}s")
    assert cached_s < convert_s / 2

    for text in ["Hello world, how are you?", "  spaces\tand\nlines 12345", "émoji 🤖 ünïcode", "<|im_start|>user"]:
        assert cached(text).input_ids == converted(text).input_ids
    assert cached("Hello world, how are you?").input_ids == PROMPTS[0]
    messages = [{"role": "user", "content": "hi"}]
    assert cached.chat_template
    assert cached.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) == \
        converted.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert cached.eos_token_id == converted.eos_token_id == 2

    # A second writer losing the rename race keeps the winner's copy and does not fail.
    hf_transformers_utils._save_atomically(converted, cache_dir)
    assert os.listdir(os.path.dirname(cache_dir)) == [os.path.basename(cache_dir)]


# --- config ----------------------------------------------------------------------------------


def test_model_config_from_gguf(gguf_path: str) -> None:
    c = ModelConfig.from_path(gguf_path)
    assert (c.arch, c.format) == ("llama", "gguf")
    assert (c.num_hidden_layers, c.hidden_size, c.num_attention_heads, c.num_key_value_heads) == (30, 576, 9, 3)
    assert (c.head_dim, c.vocab_size, c.intermediate_size, c.context_len) == (64, 49152, 1536, 8192)
    assert c.rope_theta == 1e5 and c.rms_norm_eps == pytest.approx(1e-5)
    assert c.tie_word_embeddings and not c.attention_bias
    assert 2 in c.eos_token_ids and c.generation_defaults == {}
    assert ModelConfig.from_path(gguf_path, context_length=1024).context_len == 1024
    with pytest.raises(ValueError, match="exceeds"):
        ModelConfig.from_path(gguf_path, context_length=10**6)


def test_model_config_from_hf_folder(tmp_path) -> None:
    config = dict(architectures=["Qwen2ForCausalLM"], vocab_size=300, hidden_size=64, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, intermediate_size=96, max_position_embeddings=512,
                  rope_theta=1e6, rms_norm_eps=1e-6, eos_token_id=7, torch_dtype="bfloat16")
    (tmp_path / "config.json").write_text(json.dumps(config))
    (tmp_path / "generation_config.json").write_text(json.dumps(
        dict(eos_token_id=[7, 9], temperature=0.7, top_p=0.8, top_k=20, repetition_penalty=1.05, min_p=None)))
    c = ModelConfig.from_path(str(tmp_path))
    assert (c.arch, c.format, c.head_dim, c.context_len, c.dtype) == ("qwen2", "safetensors", 16, 512, "bfloat16")
    assert c.attention_bias and not c.tie_word_embeddings and c.rope_theta == 1e6
    assert c.eos_token_ids == [7, 9]
    assert c.generation_defaults == dict(temperature=0.7, top_p=0.8, top_k=20, repetition_penalty=1.05)

    (tmp_path / "config.json").write_text(json.dumps(config | dict(architectures=["GPTNeoXForCausalLM"])))
    with pytest.raises(ValueError, match="Unsupported architectures"):
        ModelConfig.from_path(str(tmp_path))


# --- pools -----------------------------------------------------------------------------------


def test_pools() -> None:
    alloc = TokenToKVPoolAllocator(8, "cpu")
    a = alloc.alloc(5)
    assert a.tolist() == [1, 2, 3, 4, 5] and alloc.available_size() == 3
    assert alloc.alloc(4) is None
    alloc.free(a[:2])
    assert alloc.available_size() == 5 and sorted(alloc.alloc(5).tolist()) == [1, 2, 6, 7, 8]

    reqs = ReqToTokenPool(2, 16, "cpu")
    first, second = reqs.alloc(), reqs.alloc()
    assert {first, second} == {0, 1} and reqs.alloc() is None
    reqs.free(first)
    assert reqs.available_size() == 1 and reqs.alloc() == first


def test_available_ram_counts_the_reclaimable_page_cache() -> None:
    """The CPU KV budget reads MemAvailable: at least the free pages, at most the machine's RAM."""
    free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    assert free * 0.9 <= available_ram_bytes() <= total
