"""vLLM's engine arguments per role (semspec.engine.engine_args): parsed, checked against vLLM's
EngineArgs, merged over semjobs' defaults (semspec.engine.token_engine.engine_arguments), the
step engines' share of a GPU; and every engine kind's arguments accepted by vLLM's own
configuration for CUDA, on this machine without a GPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from semspec.engine import engine_args
from semspec.engine.engine_args import EngineArgsError, check, parameter_count, parse_assignment, split_gpu_memory
from semspec.engine.token_engine import CPU_SPECULATION_MAX_BATCH, DEFAULT_KV_CACHE_GB, engine_arguments
from tests.conftest import ROOT, require_vllm
from tests.semspec.engine.test_speculation import tiny_head_dir  # noqa: F401 -- a fixture used here


# --------------------------------------------------------------------------- parsing


@pytest.mark.parametrize("text, parsed", [
    ("tensor_parallel_size=2", ("tensor_parallel_size", 2)),
    ("gpu_memory_utilization=0.45", ("gpu_memory_utilization", 0.45)),
    ("enforce_eager=false", ("enforce_eager", False)),
    ("quantization=fp8", ("quantization", "fp8")),  # not JSON: the text itself
    ('compilation_config={"mode": 3}', ("compilation_config", {"mode": 3})),
    (" max_model_len =32768", ("max_model_len", 32768)),
    ("hf_overrides={\"a\": \"b=c\"}", ("hf_overrides", {"a": "b=c"})),  # the first = splits
])
def test_key_value_parses_json_values_else_text(text, parsed):
    assert parse_assignment(text) == parsed


@pytest.mark.parametrize("text", ["max_model_len", "=3", ""])
def test_an_assignment_without_a_key_or_an_equals_sign_is_refused(text):
    with pytest.raises(EngineArgsError, match="expected KEY=VALUE"):
        parse_assignment(text)


# --------------------------------------------------------------------------- checking


def test_an_unknown_name_is_refused_with_the_closest_valid_one():
    require_vllm()
    with pytest.raises(EngineArgsError) as e:
        check({"max_model_length": 4096, "tensor_paralel_size": 2}, "--engine-arg")
    assert str(e.value).splitlines() == [
        "--engine-arg: unknown engine argument 'max_model_length' (did you mean 'max_model_len'?): "
        "names are vLLM's EngineArgs fields",
        "--engine-arg: unknown engine argument 'tensor_paralel_size' (did you mean 'tensor_parallel_size'?): "
        "names are vLLM's EngineArgs fields"]


@pytest.mark.parametrize("name", sorted(engine_args.OWNED))
def test_a_name_semjobs_sets_itself_is_refused_with_the_reason(name):
    with pytest.raises(EngineArgsError, match=f"SEMJOBS_TARGET_ENGINE_ARGS: '{name}' is set by semjobs: .+"):
        check({name: "x"}, "SEMJOBS_TARGET_ENGINE_ARGS")


def test_every_owned_name_is_one_of_vllms():
    """A name vLLM renamed would stop being refused without a word."""
    require_vllm()
    assert set(engine_args.OWNED) <= set(engine_args._fields())


@pytest.mark.parametrize("args, problem", [
    ({"tensor_parallel_size": 2.5}, "tensor_parallel_size=2.5: Input should be a valid integer"),
    ({"enforce_eager": "yes"}, 'enforce_eager="yes": Input should be a valid boolean'),
    ({"gpu_memory_utilization": "0.5"}, 'gpu_memory_utilization="0.5": Input should be a valid number'),
    ({"kv_cache_dtype": "fp9"}, 'kv_cache_dtype="fp9": Input should be'),
    ({"compilation_config": {"nope": 1}}, "compilation_config={\"nope\": 1}: Unexpected keyword argument"),
])
def test_a_value_of_the_wrong_type_is_refused(args, problem):
    require_vllm()
    with pytest.raises(EngineArgsError, match="^--engine-arg: " + problem.replace("(", r"\(").replace("{", r"\{")):
        check(args, "--engine-arg")


def test_values_vllm_takes_pass():
    require_vllm()
    assert check({"tensor_parallel_size": 2, "max_model_len": 32768, "gpu_memory_utilization": 1,
                  "quantization": "awq", "enforce_eager": False, "kv_cache_memory_bytes": 2**30,
                  "max_num_batched_tokens": 8192, "kv_cache_dtype": "fp8", "compilation_config": {"mode": 3},
                  "attention_backend": "FLASH_ATTN"},  # an enum by its member's name, as vLLM's CLI takes it
                 "--engine-arg") is True
    assert check({"max_model_len": None}, "--engine-arg") is True  # declared `int = None`: unset


def test_without_vllm_only_the_owned_names_are_checked(monkeypatch):
    monkeypatch.setattr(engine_args, "vllm_installed", lambda: False)
    assert check({"max_model_length": 1}, "--engine-arg") is False
    with pytest.raises(EngineArgsError, match="'seed' is set by semjobs"):
        check({"seed": 1}, "--engine-arg")


# --------------------------------------------------------------------------- settings


def test_settings_read_each_roles_json_object(monkeypatch):
    from pydantic import ValidationError

    from semjobs.settings import Settings

    monkeypatch.setenv("SEMJOBS_TARGET_ENGINE_ARGS", '{"tensor_parallel_size": 2, "quantization": "fp8"}')
    monkeypatch.setenv("SEMJOBS_DRAFT_ENGINE_ARGS", '{"enforce_eager": true}')
    s = Settings()
    assert s.target_engine_args == {"tensor_parallel_size": 2, "quantization": "fp8"}
    assert s.draft_engine_args == {"enforce_eager": True}
    monkeypatch.delenv("SEMJOBS_DRAFT_ENGINE_ARGS")
    assert Settings().draft_engine_args == {}
    for bad in ('{"max_model_len": ', '["max_model_len"]'):
        monkeypatch.setenv("SEMJOBS_TARGET_ENGINE_ARGS", bad)
        with pytest.raises(ValidationError, match="target_engine_args"):
            Settings()


# --------------------------------------------------------------------------- merged over semjobs' defaults


def test_user_arguments_win_over_semjobs_defaults():
    require_vllm()
    ours = engine_arguments("/m", device="cpu", dtype="float32", kv_cache_gb=1)
    assert ours["enforce_eager"] is True and ours["kv_cache_memory_bytes"] == 2**30 and ours["max_num_seqs"] == 32
    mine = engine_arguments("/m", device="cpu", dtype="float32", kv_cache_gb=1, gpu_memory_utilization=0.3,
                            user={"enforce_eager": False, "kv_cache_memory_bytes": 2**29, "max_num_seqs": 4,
                                  "gpu_memory_utilization": 0.6, "max_model_len": 1024})
    assert mine == {**ours, "enforce_eager": False, "kv_cache_memory_bytes": 2**29, "max_num_seqs": 4,
                    "gpu_memory_utilization": 0.6, "max_model_len": 1024}


def test_semjobs_own_names_are_refused_where_the_arguments_are_made():
    with pytest.raises(EngineArgsError, match="'load_format' is set by semjobs"):
        engine_arguments("/m", device="cpu", user={"load_format": "pt"})


def test_the_cpu_kv_budget_is_a_cpu_default_only():
    """On a CPU vLLM needs a KV budget (2 GiB unless given); on a GPU vLLM sizes its cache from
    what gpu_memory_utilization leaves, unless a budget is given."""
    cpu = engine_arguments("/m", device="cpu", dtype="float32")
    assert cpu["kv_cache_memory_bytes"] == int(DEFAULT_KV_CACHE_GB * 2**30) and cpu["block_size"] == 32
    gpu = engine_arguments("/m", device="cuda", dtype="bfloat16")
    assert gpu["kv_cache_memory_bytes"] is None and gpu["block_size"] is None
    assert "gpu_memory_utilization" not in gpu  # vLLM's own default
    assert engine_arguments("/m", device="cuda", dtype="bfloat16", kv_cache_gb=4)["kv_cache_memory_bytes"] == 4 * 2**30


def test_a_cpu_engine_speculates_only_while_one_request_runs_unless_told():
    """vLLM's batch-size schedule on a CPU: drafted tokens while at most
    CPU_SPECULATION_MAX_BATCH requests run, none beside more; on a GPU vLLM speculates at every
    size; draft_max_batch sets the limit anywhere (0: none); a schedule of the caller's is
    kept, and one request at most needs none."""
    spec = {"method": "ngram", "num_speculative_tokens": 3}
    schedule = lambda **kw: engine_arguments("/m", speculative_config=spec, **kw)["speculative_config"]  # noqa: E731
    assert schedule(device="cpu", dtype="float32", batch_size=32)["num_speculative_tokens_per_batch_size"] == [
        (1, CPU_SPECULATION_MAX_BATCH, 3), (CPU_SPECULATION_MAX_BATCH + 1, 32, 0)]
    assert schedule(device="cuda", dtype="bfloat16", batch_size=32) == spec
    assert schedule(device="cpu", dtype="float32", batch_size=1) == spec
    assert schedule(device="cpu", dtype="float32", batch_size=32, draft_max_batch=0) == spec
    assert schedule(device="cuda", dtype="bfloat16", batch_size=32, draft_max_batch=4)[
        "num_speculative_tokens_per_batch_size"] == [(1, 4, 3), (5, 32, 0)]
    mine = {**spec, "num_speculative_tokens_per_batch_size": [(1, 64, 3)]}
    assert engine_arguments("/m", device="cpu", dtype="float32", speculative_config=mine)["speculative_config"] == mine


@pytest.mark.parametrize("method", ["eagle", "eagle3"])
def test_a_head_keeps_the_last_cached_block_on_a_cpu_only(method):
    """A new request's last cached block is recomputed for a head on a GPU, as vLLM does, not on
    a CPU, where that prefill costs every request a step's time (test_speculation: the blocks read)."""
    spec = {"method": method, "model": "/h", "num_speculative_tokens": 3}
    config = lambda device: engine_arguments("/m", device=device, dtype="float32", batch_size=1,  # noqa: E731
                                             speculative_config=spec)["speculative_config"]
    assert config("cpu") == {**spec, "disable_eagle_block_drop": True}
    assert config("cuda") == spec


# --------------------------------------------------------------------------- one GPU's memory, shared


def test_engines_sharing_a_gpu_split_it_by_parameter_count():
    shares = split_gpu_memory(0.9, {"target": 8_000, "draft": 1_000}, {})
    assert shares == pytest.approx({"target": 0.8, "draft": 0.1})
    three = split_gpu_memory(0.9, {"target": 4_000, "draft": 1_000, "writer": 4_000}, {})
    assert three == pytest.approx({"target": 0.4, "draft": 0.1, "writer": 0.4})


def test_a_share_given_is_kept_and_the_others_split_the_rest():
    shares = split_gpu_memory(0.9, {"target": 8_000, "draft": 1_000, "writer": 8_000}, {"draft": 0.2})
    assert shares == pytest.approx({"target": 0.35, "draft": 0.2, "writer": 0.35})
    assert split_gpu_memory(0.9, {"target": 8, "draft": 1}, {"target": 0.5, "draft": 0.45}) == \
        {"target": 0.5, "draft": 0.45}  # the user's, even past vLLM's default total
    with pytest.raises(ValueError, match="leaves nothing of 0.9 for draft"):
        split_gpu_memory(0.9, {"target": 8, "draft": 1}, {"target": 0.95})


def test_parameter_count_reads_the_safetensors_headers(tiny_dirs):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_dirs["target"])
    assert parameter_count(tiny_dirs["target"]) == sum(p.numel() for p in model.parameters())
    with pytest.raises(ValueError, match="no .safetensors"):
        parameter_count(tiny_dirs["target"].parent)


def test_the_step_engines_share_a_gpu_by_their_sizes_unless_a_role_says(tiny_dirs, tiny_cache):
    require_vllm()
    from semspec.engine.step_engine import ModelFiles, gpu_shares

    t, d = (ModelFiles.read(str(tiny_dirs[role]), tiny_cache) for role in ("target", "draft"))
    size_t, size_d = parameter_count(t.directory), parameter_count(d.directory)
    none = {"target": {}, "draft": {}, "writer": {}}
    shares = gpu_shares({"target": t, "draft": d, "writer": None}, none)
    assert shares == pytest.approx({"target": 0.92 * size_t / (size_t + size_d),
                                    "draft": 0.92 * size_d / (size_t + size_d)})
    given = {"target": {"gpu_memory_utilization": 0.3}, "draft": {}, "writer": {"gpu_memory_utilization": 0.3}}
    assert gpu_shares({"target": t, "draft": d, "writer": t}, given) == pytest.approx(
        {"target": 0.3, "writer": 0.3, "draft": 0.92 - 0.6})


# --------------------------------------------------------------------------- vLLM's configuration for CUDA


USER = {"tensor_parallel_size": 2, "max_model_len": 256, "enforce_eager": False, "max_num_batched_tokens": 1024}
DRAFT_USER = {"max_model_len": 256, "enforce_eager": True}


@pytest.fixture(scope="module")
def cuda_configs(tiny_vllm_dir, tiny_head_dir, tiny_dirs, tiny_cache):  # noqa: F811
    """Every engine kind's arguments, the user's included, and (in that order) the parts of
    vLLM's configuration for a CUDA engine made from them, with the step engines' GPU shares
    (tests/semspec/engine/vllm_cuda_config.py: vLLM's own create_engine_config, no GPU)."""
    require_vllm()
    from semspec.engine.speculation import speculative_config
    from semspec.engine.step_engine import ModelFiles, gpu_shares

    def args(model_dir, **kwargs) -> dict:
        return engine_arguments(model_dir, device="cuda", dtype="bfloat16", **kwargs)

    def drafting(draft: str, target_dir: Path) -> dict:
        return speculative_config(draft, str(target_dir), 3, target_dir, "0" * 64, tiny_cache)[0]

    t, d = (ModelFiles.read(str(tiny_dirs[role]), tiny_cache) for role in ("target", "draft"))
    shares = gpu_shares({"target": t, "draft": d, "writer": t},
                        {"target": USER, "draft": DRAFT_USER, "writer": USER})
    step = {"logprobs_mode": "processed_logprobs"}  # as ModelFiles.serve adds
    cases = {
        "ar": args(tiny_vllm_dir, user=USER),
        "token_sd head": args(tiny_vllm_dir, speculative_config=drafting(str(tiny_head_dir), tiny_vllm_dir), user=USER),
        "token_sd ngram": args(tiny_vllm_dir, speculative_config=drafting("ngram", tiny_vllm_dir), user=USER),
        "step target": {**args(t.directory, states_layer=t.shape.num_layers, user=USER, gpu_memory_utilization=shares["target"]),
                        **step},
        "step draft": {**args(d.directory, states_layer=1, user=DRAFT_USER, gpu_memory_utilization=shares["draft"]),
                       **step},
        "step writer": {**args(t.directory, speculative_config=drafting("ngram", t.directory), user=USER,
                               gpu_memory_utilization=shares["writer"]), **step},
    }
    env = {**os.environ, "VLLM_LOGGING_LEVEL": "ERROR", "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "tests.semspec.engine.vllm_cuda_config"], cwd=ROOT, env=env,
                          input=json.dumps(list(cases.values())), capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    configs = dict(zip(cases, json.loads(done.stdout.strip().splitlines()[-1])))
    return configs, shares, {"ar": tiny_vllm_dir, "target": t.directory, "draft": d.directory}


def assert_ours(cfg: dict, model_dir: Path, gpu_share: float = 0.92) -> None:
    """What semjobs and the user asked for, in vLLM's configuration for a CUDA engine."""
    assert cfg["device_type"] == "cuda" and cfg["model"] == str(model_dir) and cfg["dtype"] == "torch.bfloat16"
    assert cfg["max_model_len"] == 256 and cfg["enforce_eager"] is False
    assert cfg["tensor_parallel_size"] == 2 and cfg["world_size"] == 2
    assert cfg["max_num_batched_tokens"] == 1024 and cfg["max_num_seqs"] == 32
    assert cfg["kv_cache_memory_bytes"] is None and cfg["gpu_memory_utilization"] == pytest.approx(gpu_share)
    assert cfg["block_size"] != 32  # vLLM's choice, not the CPU build's
    assert cfg["load_format"] == "safetensors"


def test_ar_arguments_make_a_cuda_engine_config(cuda_configs):
    configs, _, dirs = cuda_configs
    assert_ours(configs["ar"], dirs["ar"])
    assert configs["ar"]["speculative_method"] is None and configs["ar"]["scheduler_cls"] is None


@pytest.mark.parametrize("draft, method", [("head", "eagle"), ("ngram", "ngram")])
def test_token_sd_arguments_make_a_cuda_engine_config(cuda_configs, draft, method):
    configs, _, dirs = cuda_configs
    cfg = configs[f"token_sd {draft}"]
    assert_ours(cfg, dirs["ar"])
    assert cfg["speculative_method"] == method and cfg["num_speculative_tokens"] == 3


def test_the_step_engines_arguments_make_cuda_engine_configs(cuda_configs):
    """The target and the draft store their probe layer's states; the writer is the target
    speculating (ngram here); the three share the GPU by size, each role with its own arguments."""
    configs, shares, dirs = cuda_configs
    assert_ours(configs["step target"], dirs["target"], shares["target"])
    assert_ours(configs["step writer"], dirs["target"], shares["writer"])
    draft = configs["step draft"]
    assert draft["model"] == str(dirs["draft"]) and draft["max_model_len"] == 256
    assert draft["tensor_parallel_size"] == 1 and draft["enforce_eager"] is True
    assert draft["gpu_memory_utilization"] == pytest.approx(shares["draft"])
    for name in ("step target", "step draft"):
        cfg = configs[name]
        assert cfg["speculative_method"] == "extract_hidden_states" and cfg["kv_connector"] == "StatesConnector"
        assert cfg["scheduler_cls"].endswith("StatesScheduler") and cfg["async_scheduling"] is False
    assert configs["step writer"]["speculative_method"] == "ngram"
    assert sum(shares.values()) == pytest.approx(0.92) and shares["draft"] < shares["target"] == shares["writer"]


# --------------------------------------------------------------------------- in vLLM's engines here


@pytest.mark.parametrize("kind", ["ar", "steps"])
def test_each_roles_arguments_reach_its_engines(kind, tiny_vllm_dir, tiny_cache, tmp_path):
    """On this CPU: the target's arguments reach ar's engine, the step engines' target and
    writer, the draft's the draft engine (a context of each's own), and decoding runs."""
    require_vllm()
    import gc

    from semspec.engine.step_engine import VLLMStepEngine
    from semspec.engine.token_engine import VLLMEngine
    from semspec.probes import ProbePair
    from semspec.types import GenerationConfig

    common = dict(device="cpu", cache_dir=tiny_cache, dtype="float32", batch_size=2, kv_cache_gb=0.05,
                  engine_args={"max_model_len": 128, "enforce_eager": True})
    if kind == "ar":
        engine = VLLMEngine.load(str(tiny_vllm_dir), **common)
        assert engine.max_context == 128
    else:
        probes = ProbePair.always_reject(256, 256).save(tmp_path / "probes")
        engine = VLLMStepEngine.load(str(tiny_vllm_dir), draft=str(tiny_vllm_dir), probes=str(probes),
                                     token_draft="ngram", draft_engine_args={"max_model_len": 96}, **common)
        contexts = [served.llm.model_config.max_model_len for served in (engine.target, engine.writer, engine.draft)]
        assert contexts == [128, 128, 96]
    try:
        method = "ar" if kind == "ar" else "semspec"
        assert engine.generate("Hi", GenerationConfig(method=method, max_new_tokens=4)).counters.generated_tokens
    finally:
        del engine
        gc.collect()
