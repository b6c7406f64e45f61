"""SGLang launch commands start this server unchanged: every SGLang 0.5 flag parses, SGLang's other
names of our flags are aliases, the rest are listed as ignored; a misspelt flag is an error that
names the closest real flag. Plus the flags implemented with this work."""

from __future__ import annotations

import argparse
import dataclasses
import re

import pytest

from sglang.srt.server_args import ServerArgs, prepare_server_args
from sglang.srt.server_args_compat import add_compat_args, compat_specs
from sglang.srt.sglang_flags import SGLANG_FLAGS


def _our_option_strings() -> set[str]:
    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    return set(parser._option_string_actions)


def _sample_argv(names: tuple[str, ...], switch: bool, nargs) -> list[str]:
    if switch or nargs in ("?", "*"):
        return [names[-1]]
    return [names[-1]] + ["1"] * (nargs if isinstance(nargs, int) else 1)


def test_every_sglang_flag_we_do_not_implement_parses_and_is_reported() -> None:
    specs = compat_specs(_our_option_strings())
    assert len(specs) > 450  # SGLang 0.5.23 has 531 flags (and 0.5.6 names it dropped); ours are a few dozen
    argv = [token for spec in specs for token in _sample_argv(spec.names, spec.switch, spec.nargs)]
    args = prepare_server_args(argv)
    assert args.ignored_flags == sorted(spec.names[0] for spec in specs)
    assert args.tp_size == 1 and args.model_path is None  # nothing of ours changed


def test_sglang_names_of_our_flags_are_aliases() -> None:
    args = prepare_server_args(["--tensor-parallel-size", "2", "--model", "/m", "--mem-fraction-static", "0.5"])
    assert (args.tp_size, args.model_path, args.mem_fraction_static, args.ignored_flags) == (2, "/m", 0.5, [])


def test_every_option_string_of_sglang_is_known() -> None:
    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    add_compat_args(parser)
    sglang_names = {name for names, *_ in SGLANG_FLAGS for name in names}
    assert sglang_names <= set(parser._option_string_actions)


def test_misspelt_flag_names_the_closest(capsys) -> None:
    with pytest.raises(SystemExit):
        prepare_server_args(["--mem-fraction-statik", "0.5"])
    err = capsys.readouterr().err
    assert "'--mem-fraction-statik'" in err and "did you mean --mem-fraction-static?" in err


def test_unknown_flag_without_a_close_one_is_still_an_error(capsys) -> None:
    with pytest.raises(SystemExit):
        prepare_server_args(["--zzzz-qqqq"])
    assert "unrecognized argument '--zzzz-qqqq'" in capsys.readouterr().err


@pytest.mark.parametrize("value", [0.0, -0.1, 1.5])
def test_mem_fraction_static_range(value: float) -> None:
    with pytest.raises(ValueError, match=r"--mem-fraction-static must be in \(0, 1\]"):
        ServerArgs(mem_fraction_static=value).validate()


def test_mem_fraction_static_sizes_the_cpu_kv_pool(gguf_path: str) -> None:
    from sglang.srt.model_executor.model_runner import ModelRunner

    small = ModelRunner(gguf_path, max_running_requests=4, mem_fraction_static=1e-4)
    default = ModelRunner(gguf_path, max_running_requests=4)
    per_token = small.model_config.kv_cache_bytes_per_token(small.dtype.itemsize, 1)
    # 1e-4 of the available RAM (GBs on any machine that runs the suite): a few MB of KV.
    assert 0 < small.max_total_num_tokens * per_token < 0.01 * 2**30
    assert small.max_total_num_tokens < default.max_total_num_tokens


def test_trust_remote_code_reaches_the_tokenizer(monkeypatch, tmp_path) -> None:
    import transformers

    from sglang.srt.utils import hf_transformers_utils

    seen = {}
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", lambda path, **kw: seen.update(kw) or "tok")
    assert hf_transformers_utils.get_tokenizer(str(tmp_path), trust_remote_code=True) == "tok"
    assert seen == {"trust_remote_code": True}
    assert prepare_server_args(["--trust-remote-code"]).trust_remote_code


def test_chat_template_file_replaces_the_tokenizers(tmp_path, gguf_path: str) -> None:
    from sglang.srt.utils.hf_transformers_utils import get_tokenizer, load_chat_template

    template = tmp_path / "t.jinja"
    template.write_text("{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}>>")
    args = prepare_server_args(["--chat-template", str(template)])
    args.validate()
    tokenizer = load_chat_template(get_tokenizer(gguf_path), args.chat_template)
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)
    assert rendered == "[user] hi\n>>"


def test_chat_template_must_be_a_file() -> None:
    with pytest.raises(ValueError, match="--chat-template must be a Jinja template file, got 'chatml'"):
        ServerArgs(chat_template="chatml").validate()


# ---------------------------------------------------------------------------------- flags moved into ServerArgs

MOVED = ["--skip-tokenizer-init", "--stream-output", "--log-requests", "--log-requests-level",
         "--schedule-policy", "--disable-radix-cache"]


def test_moved_flags_are_ours_not_ignored() -> None:
    assert not {name for spec in compat_specs(_our_option_strings()) for name in spec.names} & set(MOVED)
    args = prepare_server_args(["--skip-tokenizer-init", "--stream-output", "--log-requests", "--log-requests-level", "3",
                                "--schedule-policy", "lpm", "--disable-radix-cache"])
    assert (args.skip_tokenizer_init, args.stream_output, args.log_requests, args.log_requests_level) == (True, True, True, 3)
    assert (args.schedule_policy, args.disable_radix_cache, args.ignored_flags) == ("lpm", True, [])
    defaults = ServerArgs()
    assert (defaults.schedule_policy, defaults.disable_radix_cache) == ("fcfs", False)  # SGLang's defaults


@pytest.mark.parametrize("policy", ["fcfs", "lpm"])
def test_supported_schedule_policies_validate(policy: str) -> None:
    prepare_server_args(["--schedule-policy", policy]).validate()


@pytest.mark.parametrize("policy", ["random", "dfs-weight", "lof", "priority"])
def test_other_sglang_schedule_policies_parse_but_are_refused_by_name(policy: str) -> None:
    args = prepare_server_args(["--schedule-policy", policy])
    with pytest.raises(ValueError, match=rf"--schedule-policy '{policy}' .* not implement; supported: fcfs, lpm\."):
        args.validate()


def test_unknown_schedule_policy_is_a_parse_error(capsys) -> None:
    with pytest.raises(SystemExit):
        prepare_server_args(["--schedule-policy", "shortest"])
    assert "--schedule-policy" in capsys.readouterr().err


OUR_GROUPS = ["Model and tokenizer", "Device and parallelism", "Memory and scheduling", "Sampling", "Tool calling and reasoning",
              "Kernels and graphs", "HTTP server and streaming", "Speculative decoding", "Reliability and metrics", "Logging"]


def test_help_lists_our_flags_in_groups_then_the_ignored_ones_by_sglang_namespace() -> None:
    from sglang.srt.server_args_compat import group_title

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    add_compat_args(parser)
    titles = [group.title for group in parser._action_groups]
    assert [t for t in titles if t in OUR_GROUPS] == OUR_GROUPS
    grouped = {action.dest for group in parser._action_groups if group.title in OUR_GROUPS for action in group._group_actions}
    fields = {f.name for f in dataclasses.fields(ServerArgs)} - {"ignored_flags", "ignored_values", "startup_warnings"}
    assert grouped == fields  # every flag of ours in one of our groups, and nothing else there
    text = parser.format_help()
    positions = [text.index(f"\n{title}:") for title in OUR_GROUPS + [group_title("model")]]
    assert positions == sorted(positions)
    assert text.index("--skip-tokenizer-init") < text.index("\nMemory and scheduling:")
    # Every SGLang flag is listed, under SGLang's namespace of it.
    for names, *_ in SGLANG_FLAGS:
        assert all(re.search(rf"(?<![\w-]){name}(?![\w-])", text) for name in names), names
    for spec in compat_specs(_our_option_strings()):
        group = next(g for g in parser._action_groups for a in g._group_actions if spec.names[0] in a.option_strings)
        assert group.title == group_title(spec.group)
    assert group_title("exec.graph") in titles and group_title("older releases") in titles


def test_cpu_int8_activations_is_refused_off_the_cpu() -> None:
    ServerArgs(cpu_int8_activations=True, device="cpu").validate()
    with pytest.raises(ValueError, match="--cpu-int8-activations applies to the CPU engine only, got --device cuda"):
        ServerArgs(cpu_int8_activations=True, device="cuda").validate()
    assert prepare_server_args(["--cpu-int8-activations"]).cpu_int8_activations


# ---------------------------------------------------------------------------------- SGLang 0.5.23 flags


@pytest.mark.parametrize("argv,field,value", [
    (["--disable-decode-cuda-graph"], "disable_cuda_graph", True),
    (["--cuda-graph-max-bs-decode", "16"], "cuda_graph_max_bs", 16),
    (["--cuda-graph-bs-decode", "1", "2", "4"], "cuda_graph_bs", [1, 2, 4]),
    (["--disable-prefill-cuda-graph"], "disable_piecewise_cuda_graph", True),
    (["--incremental-streaming-output"], "stream_output", True),
    (["--detokenizer-worker-num", "2"], "detokenizer_worker_num", 2),
])
def test_sglang_0_5_23_names_map_onto_ours(argv, field, value) -> None:
    args = prepare_server_args(argv)
    assert getattr(args, field) == value and args.ignored_flags == []


def test_detokenizer_worker_num_above_one_warns() -> None:
    args = prepare_server_args(["--detokenizer-worker-num", "4", "--device", "cpu"]).resolve()
    assert any("--detokenizer-worker-num 4" in w and "one detokenizer" in w for w in args.startup_warnings)
    assert prepare_server_args(["--device", "cpu"]).resolve().startup_warnings == []


def test_priority_scheduling_flags_are_ours() -> None:
    args = prepare_server_args([
        "--enable-priority-scheduling", "--schedule-low-priority-values-first", "--default-priority-value", "3",
        "--abort-on-priority-when-disabled", "--sampling-mask-max-tokens", "64",
    ])
    assert args.ignored_flags == []
    assert (args.enable_priority_scheduling, args.schedule_low_priority_values_first, args.default_priority_value) == (True, True, 3)
    assert (args.abort_on_priority_when_disabled, args.sampling_mask_max_tokens) == (True, 64)
    preempt = prepare_server_args(["--priority-scheduling-preemption-threshold", "5", "--disable-priority-preemption"])
    assert preempt.ignored_flags == []
    assert (preempt.priority_scheduling_preemption_threshold, preempt.disable_priority_preemption) == (5, True)
    assert (args.priority_scheduling_preemption_threshold, args.disable_priority_preemption) == (10, False)  # SGLang's defaults


@pytest.mark.parametrize("argv, match", [
    (["--enable-priority-scheduling", "--schedule-policy", "lpm"], "priority scheduling"),
    (["--sampling-mask-max-tokens", "0"], "--sampling-mask-max-tokens"),
])
def test_scheduling_and_mask_flags_are_validated(argv: list[str], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        prepare_server_args(argv).validate()


@pytest.mark.parametrize("backend", ["triton", "flashinfer", "fa3", "trtllm_mha"])
def test_hardware_attention_backends_fall_back_to_the_cpu_backend(backend: str) -> None:
    args = prepare_server_args(["--attention-backend", backend, "--device", "cpu"]).resolve()
    assert args.attention_backend == "cpu"
    assert [w for w in args.startup_warnings if f"--attention-backend {backend}" in w and "cpu" in w]


@pytest.mark.parametrize("backend", ["cpu", "torch_native"])
def test_cpu_attention_backends_are_kept(backend: str) -> None:
    args = prepare_server_args(["--attention-backend", backend, "--device", "cpu"]).resolve()
    assert (args.attention_backend, args.startup_warnings) == (backend, [])


def test_unknown_attention_backend_is_still_a_parse_error(capsys) -> None:
    with pytest.raises(SystemExit):
        prepare_server_args(["--attention-backend", "paged"])
    assert "--attention-backend" in capsys.readouterr().err


@pytest.mark.parametrize("flag", ["--enable-streaming-session", "--cuda-graph-backend-decode", "--tokenizer-backend",
                                  "--enable-hierarchical-cache", "--speculative-ngram-capacity"])
def test_sglang_0_5_23_only_flags_parse(flag: str) -> None:
    spec = next(s for s in compat_specs(_our_option_strings()) if flag in s.names)
    args = prepare_server_args(_sample_argv(spec.names, spec.switch, spec.nargs))
    assert args.ignored_flags == [spec.names[0]]


def test_sglang_0_5_6_names_still_parse() -> None:
    older = [s for s in compat_specs(_our_option_strings()) if s.group == "older releases"]
    assert older  # e.g. names 0.5.23 dropped
    argv = [token for spec in older for token in _sample_argv(spec.names, spec.switch, spec.nargs)]
    assert prepare_server_args(argv).ignored_flags == sorted(spec.names[0] for spec in older)


def test_flag_table_is_the_generators_output() -> None:
    """sglang_flags.py is what scripts/gen_sglang_flags.py writes for the release it names."""
    import importlib.util
    from pathlib import Path

    from sglang.srt import sglang_flags

    path = Path(__file__).resolve().parents[2] / "scripts" / "gen_sglang_flags.py"
    spec = importlib.util.spec_from_file_location("gen_sglang_flags", path)
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    assert gen.render_table(sglang_flags.SGLANG_VERSION, list(SGLANG_FLAGS)) == Path(sglang_flags.__file__).read_text()
