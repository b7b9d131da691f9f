"""A worker process's engines on one GPU (semjobs.worker.gpu_memory): ar's engine and the step
engines share one split of vLLM's 0.92 by parameter counts, a role's given share kept, as the
worker builds their arguments; checked with vLLM's own configuration for CUDA, without a GPU
(tests/semspec/engine/vllm_cuda_config.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from semjobs.settings import settings
from semjobs.worker import engine as engines
from semjobs.worker import gpu_memory
from semspec.engine.engine_args import parameter_count
from tests.tiny_models import tiny_model_dir
from tests.conftest import ROOT, require_vllm

USER = {"max_model_len": 256}


@pytest.fixture(scope="module")
def draft_dir(tmp_path_factory):
    return tiny_model_dir(tmp_path_factory.mktemp("draft") / "model", num_layers=1, hidden_size=256, seed=4)


@pytest.fixture
def gpu_worker(monkeypatch, tiny_vllm_dir, draft_dir, tmp_path):
    """A worker's settings for a pair whose draft drafts steps, on a GPU."""
    require_vllm()
    for name, value in (("engine_factory", None), ("target_model", str(tiny_vllm_dir)),
                        ("draft_model", str(draft_dir)), ("probes_dir", None), ("device", "cuda"),
                        ("cache_dir", tmp_path / "cache"), ("target_engine_args", USER), ("draft_engine_args", {})):
        monkeypatch.setattr(settings, name, value)
    monkeypatch.setattr(settings, "methods", None)
    monkeypatch.setattr(engines, "_worker_process", True)
    return monkeypatch


def built_for_cuda(extra_ar: dict, extra_steps: dict) -> dict[str, dict]:
    """The vLLM arguments of ar's engine and of the step engines (target, draft) as their loads
    build them from the worker's extra arguments (VLLMEngine.load, VLLMStepEngine.load)."""
    from semspec.engine.step_engine import ModelFiles, gpu_shares
    from semspec.engine.token_engine import engine_arguments

    t, d = (ModelFiles.read(spec, settings.cache_dir) for spec in (settings.target_model, settings.draft_model))
    roles = {"target": extra_steps["engine_args"], "draft": extra_steps["draft_engine_args"],
             "writer": extra_steps["engine_args"]}
    shares = gpu_shares({"target": t, "draft": d, "writer": None}, roles)
    step = {"logprobs_mode": "processed_logprobs"}  # as ModelFiles.serve adds
    return {
        "ar": engine_arguments(t.directory, device="cuda", dtype="bfloat16", user=extra_ar["engine_args"]),
        "step target": {**engine_arguments(t.directory, device="cuda", dtype="bfloat16", states_layer=2,
                                           user=roles["target"], gpu_memory_utilization=shares["target"]), **step},
        "step draft": {**engine_arguments(d.directory, device="cuda", dtype="bfloat16", states_layer=1,
                                          user=roles["draft"], gpu_memory_utilization=shares["draft"]), **step},
    }


def test_ar_and_the_step_engines_share_one_split_of_the_gpu(gpu_worker, tiny_vllm_dir, draft_dir):
    size_t, size_d = parameter_count(tiny_vllm_dir), parameter_count(draft_dir)
    cases = built_for_cuda(engines.factory_for("ar")[1], engines.factory_for("semspec")[1])
    env = {**os.environ, "VLLM_LOGGING_LEVEL": "ERROR", "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "tests.semspec.engine.vllm_cuda_config"], cwd=ROOT, env=env,
                          input=json.dumps(list(cases.values())), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    configs = dict(zip(cases, json.loads(done.stdout.strip().splitlines()[-1])))
    share = {name: cfg["gpu_memory_utilization"] for name, cfg in configs.items()}
    # token_sd's engine holds the draft model beside the target: ar's engine is planned for it
    whole = (size_t + size_d) + size_t + size_d
    assert share == pytest.approx({"ar": 0.92 * (size_t + size_d) / whole, "step target": 0.92 * size_t / whole,
                                   "step draft": 0.92 * size_d / whole})
    assert sum(share.values()) == pytest.approx(0.92)
    assert all(cfg["device_type"] == "cuda" and cfg["max_model_len"] == 256 for name, cfg in configs.items()
               if name != "step draft")
    # token_sd swaps with ar's engine, with the same share
    assert engines.factory_for("token_sd", 4)[1]["engine_args"] == engines.factory_for("ar")[1]["engine_args"]


def test_a_roles_given_share_is_kept_by_each_of_its_engines(gpu_worker):
    gpu_worker.setattr(settings, "target_engine_args", {**USER, "gpu_memory_utilization": 0.3})
    ar, steps = engines.factory_for("ar")[1], engines.factory_for("semspec")[1]
    assert ar["engine_args"]["gpu_memory_utilization"] == steps["engine_args"]["gpu_memory_utilization"] == 0.3
    assert steps["draft_engine_args"] == {"gpu_memory_utilization": pytest.approx(0.92 - 0.6)}


@pytest.mark.parametrize("case", ["run", "cpu", "no step draft", "steps only", "tokens only"])
def test_engines_that_cannot_meet_in_one_process_split_alone(gpu_worker, case):
    """`semjobs run` decodes one method; a CPU has no GPU to share; a pair whose draft drafts no
    steps (ngram) holds ar's and token_sd's engine alone; a worker serving one kind's methods
    holds that kind's engines only: nothing is added to their arguments."""
    if case == "run":
        gpu_worker.setattr(engines, "_worker_process", False)
    else:
        gpu_worker.setattr(settings, *{"cpu": ("device", "cpu"), "no step draft": ("draft_model", "ngram"),
                                       "steps only": ("methods", ["semspec", "step_judge"]),
                                       "tokens only": ("methods", ["token_sd", "ar"])}[case])
        assert gpu_memory.engine_shares() == {}
    for method in ("ar", "semspec"):
        assert engines.factory_for(method)[1]["engine_args"] == USER


def test_a_worker_of_both_kinds_methods_plans_for_both(gpu_worker):
    gpu_worker.setattr(settings, "methods", ["semspec", "ar"])
    shares = gpu_memory.engine_shares()
    assert set(shares) == {"token", "target", "draft"} and sum(shares.values()) == pytest.approx(0.92)


def test_a_worker_plans_for_its_methods_as_it_starts(monkeypatch):
    from celery.signals import worker_init

    import semjobs.worker.tasks  # noqa: F401  (connects the worker's start-up)

    monkeypatch.setattr(engines, "_worker_process", False)
    worker_init.send(sender=None)
    assert engines._worker_process
