import json

import pytest
from click.testing import CliRunner

from semjobs.cli.main import main
from semjobs.settings import settings
from semspec.probes import ProbePair
from tests.tiny_models import tiny_model_dir
from tests.conftest import require_vllm


@pytest.fixture
def engine_settings(monkeypatch):
    """The settings' engine arguments, put back after the test (collect writes into them)."""
    monkeypatch.setattr(settings, "target_engine_args", {})
    monkeypatch.setattr(settings, "draft_engine_args", {})


@pytest.mark.real_model
def test_probe_collect_label_train_end_to_end(tmp_path, engine_settings):
    # models vLLM's CPU attention runs (64-wide heads): collect samples on vLLM where it is installed
    t = tiny_model_dir(tmp_path / "t", num_layers=2, hidden_size=256, seed=0)
    d = tiny_model_dir(tmp_path / "d", num_layers=1, hidden_size=256, seed=1)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(
        json.dumps({"id": f"q{i}", "prompt": f"Natalia sold {i} clips. How many clips?"}) + "\n"
        for i in range(4)
    ))
    runner = CliRunner()
    # two shards collected apart (as on two machines), then merged
    for shard, skip in (("s0", "0"), ("s1", "2")):
        res = runner.invoke(main, [
            "probe", "collect", "--target", str(t), "--draft", str(d), "--prompts", str(prompts),
            "--out", str(tmp_path / shard), "--samples", "3", "--max-trace-steps", "2", "--max-step-tokens", "6",
            "--max-trace-tokens", "12", "--device", "cpu", "--skip-lines", skip, "--limit-prompts", "2",
            "--chat-template-kwarg", "enable_thinking=true", "--engine-arg", "max_model_len=256",
        ])
        assert res.exit_code == 0, res.output
        assert json.loads(res.stdout[res.stdout.index("{"):])["prefixes_total"] >= 2
    cal = tmp_path / "cal"
    res = runner.invoke(main, ["probe", "merge", str(cal), str(tmp_path / "s0"), str(tmp_path / "s1")])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["questions"] == 4
    assert json.loads((cal / "collect.json").read_text())["chat_template_kwargs"] == {"enable_thinking": True}

    res = runner.invoke(main, ["probe", "label", str(cal)])
    assert res.exit_code == 0, res.output
    labels = json.loads((cal / "labels.json").read_text())
    assert labels["judge"]["judge"] == "embed" and labels["judge"]["check_numbers"] is True

    out = tmp_path / "probes"
    res = runner.invoke(main, ["probe", "train", str(cal), "--out", str(out), "--holdout", "0.25"])
    assert res.exit_code == 0, res.output
    assert "target" in res.output and "Spearman" in res.output
    assert "acceptance rule on" in res.output and "oracle" in res.output
    pair = ProbePair.load(out)
    assert (pair.target.hidden_size, pair.draft.hidden_size) == (256, 256)
    assert (out / "calibration.png").exists() and (out / "report.json").exists()


@pytest.mark.parametrize("args, problem", [
    (["--chat-template-kwarg", "tokenize=true"], "chat_template_kwargs.tokenize: not allowed"),
    (["--chat-template-kwarg", "reasoning_effort=[1]"], "chat_template_kwargs.reasoning_effort: must be a string"),
    (["--chat-template-kwarg", "enable_thinking"], "expected KEY=VALUE"),
    (["--engine-arg", "max_model_lenn=256"], "--engine-arg: unknown engine argument 'max_model_lenn' "
                                             "(did you mean 'max_model_len'?)"),
    (["--draft-engine-arg", "seed=3"], "--draft-engine-arg: 'seed' is set by semjobs"),
    (["--submit", "--engine-arg", "max_model_len=256"], "--engine-arg cannot go with --submit"),
], ids=["template-key", "template-value", "template-form", "unknown-engine-argument", "owned-engine-argument",
        "engine-argument-with-submit"])
def test_probe_collect_refuses_bad_options_before_anything_loads(tmp_path, engine_settings, args, problem):
    require_vllm()
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"id": "q", "prompt": "How many clips?"}) + "\n")
    out = tmp_path / "cal"
    # a target that does not exist: loading it would fail otherwise than the check
    res = CliRunner().invoke(main, ["probe", "collect", "--target", str(tmp_path / "none"), "--prompts", str(prompts),
                                    *([] if "--submit" in args else ["--out", str(out)]), *args])
    assert res.exit_code == 2 and problem in res.output, res.output
    assert not out.exists()


def test_probe_label_nli_needs_model(tmp_path):
    res = CliRunner().invoke(main, ["probe", "label", str(tmp_path), "--judge", "nli"])
    assert res.exit_code != 0 and "MNLI" in res.output


@pytest.mark.real_model
def test_judge_eval_command():
    from pathlib import Path

    pairs = Path(__file__).with_name("step_pairs.jsonl")
    res = CliRunner().invoke(main, ["probe", "judge-eval", str(pairs)])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["accuracy"] >= 0.85
