"""A second model family end to end, as a user with a pair of their own runs it: a tiny random
Qwen3 target and draft (one tokenizer, a thinking chat template, ``</think>`` written now and
then), named by hub name from a Hugging Face cache laid out offline, through the full service:
`probe collect --submit` on a REAL worker -> `probe merge` -> `label` -> `train`; a `semspec`
job with those probes, an `ar` job under the worker's engine arguments and a `token_sd` job
drafting with the small model (vLLM's `draft_model`), each through Redis, the worker and
Postgres, exported with `reasoning` / `content` split at `</think>` and identities naming the
hub commit; and, on a second worker whose draft is an EAGLE-3 head made for the target (a
Llama layer, as published heads for Qwen3 are) and named by hub name, a greedy `token_sd` job
writing what a greedy `ar` job writes. The configurations the service refuses (an unknown
engine argument, a draft of another tokenizer, a revision the cache lacks) are refused before
anything is stored."""

from __future__ import annotations

import json

import pytest
from sqlalchemy import func, select

from semspec.assets import GSM8K_TEST
from tests.tiny_models import (HUB_COMMIT, THINK_END, THINK_START, hub_cache_env, lay_out_hub_cache, tiny_model_dir,
                             use_hub_cache, write_eagle3_head)
from tests.conftest import require_vllm, run_cli, wait_for
from tests.worker.test_celery_e2e import read_jsonl, submit, wait_completed

pytestmark = [pytest.mark.slow, pytest.mark.real_model]  # real_model: the probe label judge, MiniLM

TARGET, DRAFT, OTHER = "tiny/qwen3-target", "tiny/qwen3-draft", "tiny/qwen3-other-tokenizer"
HEAD = "tiny/qwen3-eagle3"  # an EAGLE-3 head for TARGET
MAX_MODEL_LEN = 384  # the worker's engine argument (the models' context is 512)
QUESTIONS = [
    "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
    "How many clips did Natalia sell altogether in April and May?",
    "Weng earns $12 an hour for babysitting. Yesterday, she just did 50 minutes of babysitting. "
    "How much did she earn?",
    "How many clips did Natalia sell in May?",
]
CALIBRATION = ["--prompts", str(GSM8K_TEST), "--skip-lines", "100", "--limit-prompts", "4", "--samples", "3",
               "--max-trace-steps", "2", "--max-trace-tokens", "48", "--max-step-tokens", "12", "--seed", "3"]


@pytest.fixture(scope="module")
def hub_env(tmp_path_factory):
    """An offline hub cache holding the pair, an EAGLE-3 head for the target (its architecture
    named as SpecForge's published Qwen3 heads name theirs) and a model of another tokenizer at
    HUB_COMMIT, and a semjobs cache of this module's own: the environment of every command here."""
    root = tmp_path_factory.mktemp("second-family")
    models = {
        # 64-wide attention heads (hidden 256, 4 heads): what vLLM's CPU attention runs
        TARGET: tiny_model_dir(root / "target", num_layers=2, hidden_size=256, seed=0, arch="qwen3", thinking=True),
        DRAFT: tiny_model_dir(root / "draft", num_layers=1, hidden_size=256, seed=1, arch="qwen3", thinking=True),
        OTHER: tiny_model_dir(root / "other", num_layers=1, hidden_size=256, seed=2, arch="qwen3", thinking=True,
                              vocab_size=300, seed_text="A different corpus makes different merges."),
    }
    models[HEAD] = write_eagle3_head(root / "eagle3", models[TARGET], architecture="LlamaForCausalLMEagle3")
    for repo_id, source in models.items():
        lay_out_hub_cache(root / "hf", repo_id, source)
    return {**hub_cache_env(root / "hf"), "SEMJOBS_CACHE_DIR": str(root / "semjobs")}


@pytest.fixture
def pair_env(service_env, hub_env):
    """The deployment's settings: the pair by hub name, decoded by vLLM (no stand-in), drafting
    at any batch (draft_max_batch 0: a CPU's default drafts only for a sequence decoding alone,
    which three questions sampled to the same length may never leave, and then the jobs would
    not show that the probes are asked and that the small model drafts)."""
    return {**service_env, **hub_env, "SEMJOBS_ENGINE_FACTORY": "", "SEMJOBS_TARGET_MODEL": TARGET,
            "SEMJOBS_DRAFT_MODEL": DRAFT, "SEMJOBS_KV_CACHE_GB": "0.25", "SEMJOBS_THREADS": "1",
            "SEMJOBS_DRAFT_MAX_BATCH": "0"}


def write_questions(path) -> None:
    with open(path, "w") as f:
        for i, question in enumerate(QUESTIONS):
            f.write(json.dumps({"id": f"q{i}", "prompt": question,
                                "chat_template_kwargs": {"enable_thinking": True}}) + "\n")


def stored_jobs(url) -> int:
    from semjobs.db.models import Job
    from semjobs.db.session import session_factory

    with session_factory(url)() as s:
        return s.scalar(select(func.count()).select_from(Job))


def calibrate(env, workers, out) -> None:
    """`probe collect --submit` on the worker, then merge, label and train into env's probes."""
    cal_id = run_cli(["probe", "collect", *CALIBRATION, "--submit"], env).stdout.strip().splitlines()[-1]

    def finished():
        st = json.loads(run_cli(["probe", "status", cal_id], env).stdout)
        return st["pending"] == st["running"] == 0 and st

    st = wait_for(finished, 300, interval=2, what="the calibration")
    assert st["failed"] == 0 and st["done"] == 4 and st["prefixes"] >= 4, "\n".join(
        workers.log(p)[-3000:] for p in workers.procs)
    run_cli(["probe", "merge", str(out), "--calibration", cal_id], env)
    meta = json.loads((out / "collect.json").read_text())
    assert meta["models"]["target"]["spec"] == f"{TARGET}@{HUB_COMMIT}"
    assert meta["models"]["draft"]["spec"] == f"{DRAFT}@{HUB_COMMIT}"
    # the traces are cut at </think> as at a blank line (semspec.steps)
    traces = [json.loads(line)["steps"] for line in (out / "traces.jsonl").read_text().splitlines()]
    assert any(step.endswith(THINK_END) for steps in traces for step in steps), traces
    run_cli(["probe", "label", str(out)], env)
    run_cli(["probe", "train", str(out), "--out", env["SEMJOBS_PROBES_DIR"]], env)


def submit_questions(env, tmp_path, method, *options) -> str:
    """A job of QUESTIONS on env's queue: its id."""
    src = tmp_path / "questions.jsonl"
    write_questions(src)
    return submit(env, src, "--method", method, *options)


def exported(env, workers, tmp_path, job_id, name) -> tuple[list[dict], dict]:
    """The job once the worker has completed it: (its export, its manifest), written as ``name``."""
    wait_completed(env["SEMJOBS_DATABASE_URL"], job_id, workers, timeout=180)
    out = tmp_path / f"{name}.jsonl"
    run_cli(["export", job_id, "-o", str(out)], env)
    errors = tmp_path / f"{name}.jsonl.errors.jsonl"
    assert not errors.exists(), errors.read_text()
    rows = read_jsonl(out)
    assert [r["id"] for r in rows] == [f"q{i}" for i in range(len(QUESTIONS))], rows
    return rows, json.loads((tmp_path / f"{name}.jsonl.manifest.json").read_text())


def decode(env, workers, tmp_path, method, *options) -> tuple[list[dict], dict]:
    """A job of QUESTIONS through the queue, the worker and Postgres: (its export, its manifest)."""
    job_id = submit_questions(env, tmp_path, method, "--temperature", "0.6", *options)
    return exported(env, workers, tmp_path, job_id, method)


def check_split_at_think_end(rows) -> None:
    """Every output thinks and then answers: `reasoning` before its last </think>, `content` after."""
    for r in rows:
        assert THINK_END in r["output"], r["output"]
        reasoning, content = r["output"].rsplit(THINK_END, 1)
        assert (r["reasoning"], r["content"]) == (reasoning.strip(), content.strip())


def check_identities(identities, *roles, draft: str = DRAFT) -> None:
    """The hub models' identities name the commit their names resolved to."""
    repo_ids = {"target": TARGET, "draft": draft}
    for role in roles:
        assert identities[role].startswith(f"{repo_ids[role]}@{HUB_COMMIT}@sha256:"), identities


def test_the_pair_thinks_as_qwen3_does(hub_env, monkeypatch):
    """<think> and </think> are tokens that decoding keeps, the end one found as the marker,
    and the template opens an empty thought only where enable_thinking is false."""
    from semspec.models.specs import load_tokenizer
    from semspec.prompts import render_prompt
    from semspec.steps import detect_think_end

    use_hub_cache(monkeypatch, hub_env["HF_HUB_CACHE"])
    tokenizer, _ = load_tokenizer(TARGET, hub_env["SEMJOBS_CACHE_DIR"])
    ids = tokenizer.convert_tokens_to_ids([THINK_START, THINK_END])
    assert tokenizer.decode(ids, skip_special_tokens=True) == THINK_START + THINK_END
    assert detect_think_end(tokenizer) == THINK_END
    assistant = "<|im_start|>assistant\n"
    for kwargs, opening in ((None, assistant), ({"enable_thinking": True}, assistant),
                            ({"enable_thinking": False}, f"{assistant}<think>\n\n</think>\n\n")):
        assert render_prompt(tokenizer, "2 + 2?", template_kwargs=kwargs).endswith(f"2 + 2?<|im_end|>\n{opening}")


def test_a_qwen3_pair_by_hub_name_through_the_service(pair_env, workers, tmp_path):
    require_vllm()
    # a worker of the pair the head makes (a queue of its own) decodes greedy ar and token_sd
    # jobs while the other works, in float32 (lossless to the token: a float32 pass computes
    # the same numbers over one token or a verification's four), drafting at any batch
    eagle3_env = {**pair_env, "SEMJOBS_DRAFT_MODEL": HEAD, "SEMJOBS_QUEUE": f"{pair_env['SEMJOBS_QUEUE']}-eagle3",
                  "SEMJOBS_DTYPE": "float32"}
    workers.env = eagle3_env
    workers.start("qwen3-eagle3")
    greedy = {method: submit_questions(eagle3_env, tmp_path, method, "--temperature", "0", "--max-new-tokens", "40")
              for method in ("ar", "token_sd")}
    # the probes are calibrated once the worker runs, and loaded when a semspec job comes
    pair_env = {**pair_env, "SEMJOBS_PROBES_DIR": str(tmp_path / "probes")}
    workers.env = pair_env
    # engine arguments on the worker's command line reach every engine it starts
    workers.start("qwen3", "--engine-arg", f"max_model_len={MAX_MODEL_LEN}")
    calibrate(pair_env, workers, tmp_path / "cal")

    # semspec: the draft writes steps, the probes trained above judge them
    rows, manifest = decode(pair_env, workers, tmp_path, "semspec", "--max-new-tokens", "40")
    check_split_at_think_end(rows)
    assert sum(r["stats"]["steps_drafted"] for r in rows) > 0
    check_identities(manifest["identities"], "target", "draft")
    assert manifest["identities"]["target_probe"].startswith(pair_env["SEMJOBS_PROBES_DIR"])
    assert manifest["identities"]["engine_args"] == {"target": {"max_model_len": MAX_MODEL_LEN}}

    rows, manifest = decode(pair_env, workers, tmp_path, "ar", "--max-new-tokens", "40")
    check_split_at_think_end(rows)
    check_identities(manifest["identities"], "target")
    assert manifest["identities"]["engine_args"] == {"target": {"max_model_len": MAX_MODEL_LEN}}

    # token_sd: vLLM's draft_model, the small Qwen3 drafting tokens for the large
    rows, manifest = decode(pair_env, workers, tmp_path, "token_sd", "--max-new-tokens", "40")
    check_split_at_think_end(rows)
    assert sum(r["stats"]["drafted_tokens"] for r in rows) > 0
    check_identities(manifest["identities"], "target", "draft")

    # token_sd with the EAGLE-3 head (vLLM's eagle3, the kind read from its config): greedy, it
    # writes what ar writes
    ar_rows, _ = exported(eagle3_env, workers, tmp_path, greedy["ar"], "ar-greedy")
    rows, manifest = exported(eagle3_env, workers, tmp_path, greedy["token_sd"], "token_sd-eagle3")
    assert [r["output"] for r in rows] == [r["output"] for r in ar_rows]
    assert sum(r["stats"]["drafted_tokens"] for r in rows) > 0
    check_identities(manifest["identities"], "target", "draft", draft=HEAD)


@pytest.mark.parametrize("command, settings, refusal", [
    # the engine arguments are checked against vLLM's EngineArgs before the file is read
    (["run", "--engine-arg", "max_model_lenn=384"], {}, "did you mean 'max_model_len'"),
    (["submit", "--method", "step_judge"], {"SEMJOBS_DRAFT_MODEL": OTHER}, "the target's tokenizer"),
    (["submit", "--method", "token_sd"], {"SEMJOBS_DRAFT_MODEL": OTHER}, "the target's tokenizer"),
    (["submit"], {"SEMJOBS_TARGET_MODEL": f"{TARGET}@nosuchrev"}, f"{TARGET} at revision 'nosuchrev'"),
    (["submit", "--method", "token_sd"], {"SEMJOBS_DRAFT_MODEL": f"{DRAFT}@nosuchrev"},
     f"{DRAFT} at revision 'nosuchrev'"),
], ids=["unknown-engine-argument", "step-draft-of-another-tokenizer", "token-draft-of-another-tokenizer",
        "target-revision-missing", "draft-revision-missing"])
def test_a_configuration_that_cannot_run_is_refused_before_anything_is_stored(
        pair_env, tmp_path, command, settings, refusal):
    require_vllm()
    src = tmp_path / "questions.jsonl"
    write_questions(src)
    out, db = tmp_path / "out.jsonl", tmp_path / "run.sqlite"
    where = ["-o", str(out), "--db", f"sqlite:///{db}"] if command[0] == "run" else []
    res = run_cli([command[0], str(src), *where, *command[1:]], {**pair_env, **settings}, check=False)
    assert res.returncode == 2 and refusal in res.stderr, res.stderr
    assert stored_jobs(pair_env["SEMJOBS_DATABASE_URL"]) == 0
    assert not db.exists() and not out.exists()
