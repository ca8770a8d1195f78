"""Shared fixtures: seeded tiny checkpoints for every architecture and config corner the spine must handle."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

# Compiles in tests keep the targets' default knobs: no timing on a loaded CI host, the same packages every run.
# tests/test_tune.py turns tuning on where it tests it.
os.environ.setdefault("EDGELLM_TUNE", "off")
# no verify program (speculative decoding) unless a test asks for one (verify_tokens=8): its kernels would add ~15% to
# every compile of the session; tests/test_speculative.py and the front ends' demo_q8 carry it
os.environ.setdefault("EDGELLM_VERIFY_TOKENS", "0")

from edgellm.models.synthetic import make_checkpoint

PRELOAD_VAR = "EDGELLM_TESTS_LD_PRELOAD_WAS"   # pytest_configure: the LD_PRELOAD the workers' children get back

# name -> (architecture, config overrides). Together they cover: GQA, MHA, tied embeddings, head_dim 8 and 64,
# a vocab that is not a multiple of 64, qkv bias (Qwen2), q/k norm (Qwen3), llama3 rope scaling.
TINY = {
    "llama-gqa": ("LlamaForCausalLM", {}),
    "llama-tied-hd8": ("LlamaForCausalLM", {"tie_word_embeddings": True, "hidden_size": 32, "num_attention_heads": 4,
                                            "num_key_value_heads": 4, "head_dim": 8, "vocab_size": 1001}),
    "llama3-hd64": ("LlamaForCausalLM", {"hidden_size": 128, "num_attention_heads": 2, "num_key_value_heads": 1,
                                         "head_dim": 64, "intermediate_size": 256, "rope_theta": 500000.0,
                                         "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                                          "high_freq_factor": 4.0,
                                                          "original_max_position_embeddings": 64}}),
    "qwen2": ("Qwen2ForCausalLM", {"tie_word_embeddings": True}),
    "qwen3": ("Qwen3ForCausalLM", {"num_hidden_layers": 3}),
    "gemma3": ("Gemma3ForCausalLM", {"num_hidden_layers": 3, "tie_word_embeddings": True}),
}


# ---- test tiers -----------------------------------------------------------------------------------------------------
# `pytest -m "not slow"` is the fast tier: every capability once, a few minutes on 2 cores. Marked slow here (seconds
# measured with --durations=0 on the 2-core CI machine, -n 2): whole modules whose fixtures compile many packages,
# with the fast tier's representative of their capability named, and single tests over about 3 s.
SLOW_MODULES = {
    "test_npu.py": "880 s; the HTP graphs and the runtime's QNN backend: test_npu_f16.py",
    "test_npu_w4.py": "136 s; W4A16 blocks on the HTP: test_npu_f16.py",
    "test_targets_arm.py": "180 s of qemu; the aarch64 build: test_ops_quant.py::test_aarch64_build",
    "test_ops_arm.py": "86 s of qemu; the aarch64 build: test_ops_quant.py::test_aarch64_build",
    "test_tune.py": "174 s; tuned schedules: test_ops.py, test_ops_quant.py",
    "test_neuron_window.py": "131 s; the bundled FFN kernels: test_ops_bundled_ffn.py",
    "test_moe_offload.py": "106 s; MoE packages: test_demo.py::test_demo_moe_uses_all_experts, test_moe.py",
    "test_quant_packages.py": "115 s; schemes: test_quant.py, test_ops_quant.py, test_window.py's q4g32/t2 packages",
    "test_sliding_window.py": "54 s; attention windows: test_ops.py",
}
SLOW_TESTS = {   # module -> test functions (every parameter)
    "test_android_app.py": ("test_a_draft_package_through_the_bridge",),
    "test_constraint_automaton.py": ("test_fifty_schemas_through_edgellm_run_parse_and_validate",),
    "test_android_apk.py": ("test_apk_assembles_signs_and_verifies",
                            "test_cmake_builds_the_library_and_exports_every_external"),
    "test_c_runtime.py": ("test_thread_pool_unit",),
    "test_context_shift.py": ("test_a_shifted_context_is_a_fresh_one_holding_the_kept_ids",
                              "test_runtime_default_and_the_command_lines"),
    "test_cli_cache.py": ("test_first_hour_commands",),
    "test_demo.py": ("test_demo_bitnet_numpy_agrees_with_transformers", "test_eval_ppl_matches_transformers_and_beats_unigram"),
    "test_errors.py": ("test_failed_build_leaves_nothing_behind", "test_missing_config", "test_unknown_architecture",
                       "test_unknown_option_values"),
    "test_fusion.py": ("test_arm_fused_equals_separate", "test_fused_fallback_kernels",
                       "test_fused_kernel_equals_separate_kernels",
                       "test_package_fused_equals_unfused", "test_prequantized_parts_are_stacked",
                       "test_qkv_bias_and_qk_norm_models"),
    "test_gguf.py": ("test_bitnet_gguf_keeps_the_ternary_weights",),
    "test_gguf_blocks.py": ("test_a_files_blocks_compile_kept",),   # 49-88 s each; the MoE file's case is slow only
    "test_speculative.py": ("test_draft_package_under_a_budget_and_with_moe",),   # 66 s; test_draft_package_gives_plain_tokens
    "test_window_cache.py": ("test_opencl_window_caches_move_on_the_device",),
    "test_fuzz.py": ("test_bad_rope_table_is_refused_under_asan", "test_mutated_tables_of_other_kinds",
                     "test_truncated_routing_table_is_refused_under_asan"),
    "test_gptq.py": ("test_gptq_model_demo_llama",),
    "test_kv_cache.py": ("test_the_attention_kernel_reads_a_float16_or_quantized_cache",
                         "test_an_f16_cache_gives_the_f32_caches_logits_in_half_the_bytes",
                         "test_a_quantized_cache_gives_the_numpy_models_logits_with_rounded_kv",
                         "test_speculation_state_and_shift_with_a_smaller_cache",
                         "test_quantized_caches_on_arm_under_qemu"),
    "test_inputs.py": ("test_cli_compile_bad_config_is_one_line", "test_tied_lm_head_only_compiles",
                       "test_tied_lm_head_only_matches_transformers", "test_transformers_written_configs_are_accepted"),
    "test_moe.py": ("test_demo_moe_package_matches_transformers", "test_expert_layout_and_bytes_read_per_token",
                    "test_f32_package_matches_numpy", "test_gptq_package_matches_oracle",
                    "test_quantized_package_matches_oracle",
                    "test_row_limited_linear_kernels_compute_only_their_rows", "test_rpi5_package_under_qemu_matches_host"),
    "test_npu_f16.py": ("test_w4a16_mixed_keeps_v_and_down_int8",),
    "test_opencl.py": ("test_android_gpu_package_layout", "test_same_tokens_and_logits_as_the_cpu"),
    "test_ops.py": ("test_attention_other_vector_widths", "test_linear_other_vector_widths",
                    "test_tuned_schedules_do_not_fall_back"),
    "test_ops_quant.py": ("test_fallback_kernels_are_correct", "test_other_vector_widths",
                          "test_schemes_through_the_lowering_interface", "test_tuned_schedules_do_not_fall_back"),
    "test_pipeline.py": ("test_chunk_size_does_not_change_logits", "test_f16_package", "test_long_chunk_matches_numpy",
                         "test_short_prefill_program"),
    "test_prefix_reuse.py": ("test_float_package_reuse_is_exact",),
    "test_readme.py": ("test_block_runs",),
    "test_reliability.py": ("test_bad_output_places", "test_cli_bad_values_are_one_line",
                            "test_code_generator_death_leaves_nothing",
                            "test_full_disk_is_one_line_and_cleans_up", "test_package_is_replaced_and_stale_temps_removed",
                            "test_recompile_keeps_the_users_files", "test_sigterm_during_compile_leaves_nothing",
                            "test_user_dir_with_a_manifest_is_not_replaced"),
    "test_serve.py": ("test_api_key_and_network_binding", "test_flags_checked_before_compiling"),
    "test_sizes.py": ("test_every_front_end_reads_a_budget_alike",),
}
FAST_ANYWAY = {   # a slow function's one parameter that stands for its capability in the fast tier
    "test_gguf_blocks.py::test_a_files_blocks_compile_kept[LlamaForCausalLM-Q4_1-q4m32-True-dims0]",
    "test_gguf_blocks.py::test_a_files_blocks_compile_kept[LlamaForCausalLM-Q4_K-q4m32-codes-dims1]",
    "test_gguf_blocks.py::test_a_files_blocks_compile_kept[LlamaForCausalLM-Q5_0-q6-True-dims2]",
    "test_opencl.py::test_same_tokens_and_logits_as_the_cpu[demo-llama-t2]",
    "test_gguf.py::test_bitnet_gguf_keeps_the_ternary_weights[TQ2_0]",
    "test_context_shift.py::test_a_shifted_context_is_a_fresh_one_holding_the_kept_ids[4-0-gemma2]",
    "test_kv_cache.py::test_the_attention_kernel_reads_a_float16_or_quantized_cache[4-40-0-True-float16]",
    "test_kv_cache.py::test_the_attention_kernel_reads_a_float16_or_quantized_cache[8-80-9-False-q8]",
    "test_kv_cache.py::test_the_attention_kernel_reads_a_float16_or_quantized_cache[4-40-0-True-q4]",
    "test_kv_cache.py::test_a_quantized_cache_gives_the_numpy_models_logits_with_rounded_kv[LlamaForCausalLM-q4g32-q8]",
    "test_kv_cache.py::test_a_quantized_cache_gives_the_numpy_models_logits_with_rounded_kv[LlamaForCausalLM-f32-q4]",
    "test_kv_cache.py::test_speculation_state_and_shift_with_a_smaller_cache[q8]",
    "test_kv_cache.py::test_an_f16_cache_gives_the_f32_caches_logits_in_half_the_bytes[llama]",
}


def pytest_configure(config):
    """The controller of a `pytest -n` run (before its workers start) builds tests/c/exact_pow2.c and has the workers
    start with it preloaded: the HTP emulator's pow(2, k) calls then take half the NPU tests' time, with the same bits.
    Each worker drops it from its environment again, so that the programs the tests start (aarch64 ones under qemu
    among them, whose loader would complain of an x86 library) see the environment as it was. A run without workers,
    or without a C compiler, just runs slower."""
    if hasattr(config, "workerinput"):
        if PRELOAD_VAR in os.environ:
            was = os.environ.pop(PRELOAD_VAR)
            if was:
                os.environ["LD_PRELOAD"] = was
            else:
                os.environ.pop("LD_PRELOAD", None)
        return
    if sys.platform != "linux" or not config.getoption("numprocesses", None):
        return
    src = Path(__file__).parent / "c" / "exact_pow2.c"
    out = Path(tempfile.mkdtemp(prefix="edgellm-tests-")) / "exact_pow2.so"
    try:
        built = subprocess.run(["gcc", "-O2", "-shared", "-fPIC", str(src), "-o", str(out), "-ldl"],
                               capture_output=True).returncode == 0
    except OSError:   # no gcc
        built = False
    if built:
        was = os.environ.get("LD_PRELOAD", "")
        os.environ[PRELOAD_VAR] = was
        os.environ["LD_PRELOAD"] = ":".join(filter(None, [str(out), was]))
    config._edgellm_preload = out


def pytest_unconfigure(config):
    out = getattr(config, "_edgellm_preload", None)
    if out is not None:
        shutil.rmtree(out.parent, ignore_errors=True)


def pytest_collection_modifyitems(config, items):
    for item in items:
        mod = item.path.name
        if f"{mod}::{item.name}" in FAST_ANYWAY:
            continue
        if mod in SLOW_MODULES or item.originalname in SLOW_TESTS.get(mod, ()):
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="session", autouse=True)
def kernel_cache(tmp_path_factory):
    """Each kernel is compiled once per session (compiler/kernels_build.py caches its object file by hash): packages
    of the same model in several schemes, or compiled by several test modules, share it; tests of the build's
    failure paths turn it off."""
    old = os.environ.get("EDGELLM_KERNEL_CACHE")
    if os.environ.get("PYTEST_XDIST_WORKER"):   # pytest -n: the workers share one cache (entries land by rename)
        root = tmp_path_factory.getbasetemp().parent / "kernel-cache"
        root.mkdir(exist_ok=True)
    else:
        root = tmp_path_factory.mktemp("kernel-cache")
    os.environ["EDGELLM_KERNEL_CACHE"] = str(root)
    yield
    if old is None:
        os.environ.pop("EDGELLM_KERNEL_CACHE", None)
    else:
        os.environ["EDGELLM_KERNEL_CACHE"] = old


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory):
    """name -> checkpoint dir, generated once per session."""
    root = tmp_path_factory.mktemp("ckpt")
    return {name: make_checkpoint(root / name, arch, seed=i, **cfg) for i, (name, (arch, cfg)) in enumerate(TINY.items())}


@pytest.fixture(scope="session")
def demo_q8(tmp_path_factory):
    """The demo model compiled for this CPU in q8, once per session, for the front-end tests (JNI, serve, chat) that
    only read it."""
    from edgellm.compiler.driver import compile_model

    demo = Path(__file__).resolve().parents[1] / "models" / "demo" / "demo-llama"
    return compile_model(demo, target="host", quant="q8", out=tmp_path_factory.mktemp("demo-q8") / "demo-q8",
                         progress=False, verify_tokens=8)


@pytest.fixture(params=sorted(TINY))
def tiny_model(request, tiny_models):
    return tiny_models[request.param]


@pytest.fixture()
def plain_kernels(monkeypatch):
    """Every tuned schedule raises, so make_kernel falls back to the plain kernels; its cache is cleared before and
    after, so no other test sees a fallback kernel."""
    from edgellm.compiler import ops

    real = ops._build

    def failing(op, cpu, p, fast):
        if fast:
            raise RuntimeError("schedule rejected (test)")
        return real(op, cpu, p, fast)

    monkeypatch.setattr(ops, "_build", failing)
    ops._make_cached.cache_clear()
    yield
    ops._make_cached.cache_clear()
