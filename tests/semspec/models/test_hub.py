"""Hub names (``org/name[@revision]``) resolved offline from a Hugging Face cache laid out on
disk as the hub's own client lays it out."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from semspec.models.hub import HubName, parse_hub_name
from semspec.models.identity import content_sha256, derived_sha256
from semspec.models.paths import ModelLoadError
from semspec.models.specs import load_tokenizer, model_directory, model_source, resolve_spec, spec_sha256
from tests.tiny_models import HUB_COMMIT as COMMIT, lay_out_hub_cache, use_hub_cache

OTHER_COMMIT = "fedcba9876543210fedcba9876543210fedcba98"
CONFIG_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
                "chat_template.jinja")


@pytest.fixture
def hub(tmp_path, tiny_dirs, monkeypatch):
    """An offline hub cache holding the tiny target as ``org/tiny`` at COMMIT."""
    cache = tmp_path / "hf"
    snapshot = lay_out_hub_cache(cache, "org/tiny", tiny_dirs["target"], refs=("main", "v1"))
    use_hub_cache(monkeypatch, cache)
    return snapshot


def test_what_counts_as_a_hub_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert parse_hub_name("Qwen/Qwen3-8B") == HubName("Qwen/Qwen3-8B", None)
    assert parse_hub_name("deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B@v1.0") == HubName(
        "deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B", "v1.0")
    assert parse_hub_name(f"org/name@{COMMIT}").revision == COMMIT
    assert parse_hub_name("org/name@refs/pr/1").revision == "refs/pr/1"
    not_hub_names = ["gpt2", "a/b/c", "/abs/path", "./org", "~/model", "org/name.gguf", "org/na me",
                     "org/name@", "org/name@../../etc", "org/a--b", "embedded:smollm2-135m", "org/"]
    for spec in not_hub_names:
        assert parse_hub_name(spec) is None, spec
    (tmp_path / "models" / "foo").mkdir(parents=True)
    assert parse_hub_name("models/foo") is None  # an existing path is a path


def test_hub_names_resolve_to_their_snapshot(hub, tmp_path):
    for spec in ("org/tiny", f"org/tiny@{COMMIT}", "org/tiny@main", "org/tiny@v1"):
        resolved = resolve_spec(spec, tmp_path / "semjobs")
        assert (resolved.kind, resolved.path, resolved.commit) == ("hf", hub.resolve(), COMMIT), spec
    directory, sha = model_directory("org/tiny", tmp_path / "semjobs")
    assert directory == hub.resolve() and sha == spec_sha256(f"org/tiny@{COMMIT}", tmp_path / "semjobs")


def test_the_identity_is_named_by_the_commit_the_name_resolved_to(hub, tmp_path):
    """A manifest names the snapshot that made the outputs, whichever ref the spec named."""
    for spec in ("org/tiny", "org/tiny@v1", f"org/tiny@{COMMIT}"):
        directory, identity = model_source(spec, tmp_path / "semjobs")
        assert (directory, identity.name) == (hub.resolve(), f"org/tiny@{COMMIT}"), spec
        assert identity.sha256 == spec_sha256(spec, tmp_path / "semjobs")


def test_the_identity_holds_the_commit_and_the_weights_not_the_caches(hub, tiny_dirs, tmp_path, monkeypatch):
    sha = spec_sha256("org/tiny", tmp_path / "semjobs_a")
    weights = content_sha256(tiny_dirs["target"], tmp_path / "semjobs_a", suffixes=(".safetensors",))
    assert sha == derived_sha256("hf-hub", COMMIT, weights)
    assert sha != spec_sha256(str(tiny_dirs["target"]), tmp_path / "semjobs_a")  # the commit counts

    # the same snapshot in another hub cache, hashed through another semjobs cache, with a
    # pickle copy of the weights another tool fetched beside it: the same model
    elsewhere = lay_out_hub_cache(tmp_path / "elsewhere" / "hf", "org/tiny", tiny_dirs["target"])
    (elsewhere / "pytorch_model.bin").write_bytes(b"not loaded")
    use_hub_cache(monkeypatch, tmp_path / "elsewhere" / "hf")
    assert spec_sha256("org/tiny", tmp_path / "semjobs_b") == sha

    # the same weights under another commit: another model
    lay_out_hub_cache(tmp_path / "elsewhere" / "hf", "org/tiny", tiny_dirs["target"], commit=OTHER_COMMIT,
                      refs=("v2",))
    assert spec_sha256("org/tiny@v2", tmp_path / "semjobs_b") != sha


@pytest.mark.parametrize("spec, named", [
    ("org/nothing", ["org/nothing", "'main'", "hf download org/nothing "]),
    ("org/tiny@v9", ["org/tiny", "'v9'", "hf download org/tiny --revision v9 "]),
    (f"org/tiny@{OTHER_COMMIT}", ["org/tiny", OTHER_COMMIT, f"--revision {OTHER_COMMIT}"]),
])
def test_a_model_or_revision_not_cached_offline_is_refused_naming_it_and_the_fix(hub, tmp_path, spec, named):
    with pytest.raises(ModelLoadError) as e:
        resolve_spec(spec, tmp_path / "semjobs")
    for part in [*named, "HF_HUB_OFFLINE=1", "HF_HUB_OFFLINE=0", "local model directory"]:
        assert part in str(e.value), (part, str(e.value))


def test_with_the_hub_unreachable_the_cache_serves_and_a_miss_says_why(hub, tmp_path, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")  # nothing listens there
    assert resolve_spec("org/tiny", tmp_path / "semjobs").commit == COMMIT
    unreachable = r"org/nothing .*hub could not be reached \(ConnectError.*HF_HUB_OFFLINE=0"
    with pytest.raises(ModelLoadError, match=unreachable):
        resolve_spec("org/nothing", tmp_path / "semjobs")


def test_a_snapshot_without_safetensors_tokenizes_but_does_not_load(tiny_dirs, tmp_path, monkeypatch):
    lay_out_hub_cache(tmp_path / "hf", "org/tokenizer-only", tiny_dirs["target"], names=CONFIG_FILES)
    use_hub_cache(monkeypatch, tmp_path / "hf")
    tokenizer, context = load_tokenizer("org/tokenizer-only", tmp_path / "semjobs")
    assert context == 512 and tokenizer.chat_template
    with pytest.raises(ModelLoadError, match=r"org/tokenizer-only.*no \*\.safetensors.*hf download"):
        model_directory("org/tokenizer-only", tmp_path / "semjobs")


def test_a_local_directory_named_like_a_hub_name_wins(hub, tiny_dirs, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    local = shutil.copytree(tiny_dirs["draft"], tmp_path / "org" / "tiny")
    resolved = resolve_spec("org/tiny", tmp_path / "semjobs")
    assert (resolved.path, resolved.commit) == (local.resolve(), None)
    assert spec_sha256("org/tiny", tmp_path / "semjobs") == content_sha256(local, tmp_path / "semjobs")


def test_load_tokenizer_on_a_hub_name(hub, tiny_dirs, tmp_path):
    from transformers import AutoTokenizer

    tokenizer, context = load_tokenizer("org/tiny@main", tmp_path / "semjobs")
    local = AutoTokenizer.from_pretrained(tiny_dirs["target"])
    assert context == 512 and tokenizer.get_vocab() == local.get_vocab()
    assert tokenizer.chat_template == local.chat_template


def test_submit_checks_prompt_lengths_with_a_hub_named_target(hub, tmp_path):
    """`semjobs submit`'s prompt-length check (semjobs.jobs.context) reads a hub-named
    target's tokenizer and context from the cache."""
    from semjobs.jobs.context import ContextCheck

    check = ContextCheck("org/tiny", tmp_path / "semjobs")
    sentence = "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
    assert check(sentence * 11) is None  # over MIN_CHECKED_BYTES, so tokenized: ~480 tokens fit
    assert (check.unavailable, check.max_context) == (None, 512)
    part, problem = check("1 2 3 4 5 6 7 8 9 " * 200)
    assert part == "prompt" and "context of 512 tokens" in problem


def test_a_judge_named_by_hub_name_records_its_commit(hub):
    from semspec.calibration.judge import EmbeddingJudge

    judge = EmbeddingJudge("org/tiny")
    assert judge.model_dir == hub.resolve()
    assert judge.describe()["model"] == f"org/tiny@{COMMIT}"
    assert judge.embed(["one step", "another step"]).shape[0] == 2
