"""token_sd on vLLM's own speculative decoding (semspec.engine.speculation, semspec.engine.head_plugin):
the head exported for vLLM's eagle method, and ngram, on a tiny random model (one engine at
a time: vLLM's state is per process); the shipped head on SmolLM2 (real_model); every other
draft kind's speculative config, identity and refusals, from tiny random models laid out as
each kind is published (decoding with them: test_token_engine_drafts.py)."""

from __future__ import annotations

import gc
import json
import shutil
from pathlib import Path

import pytest
import torch

from semspec.components import EMBEDDED_DRAFT, EMBEDDED_HEAD, draft_model_spec, step_draft_problem
from semspec.models.identity import ModelIdentity, derived_sha256
from semspec.models.specs import spec_sha256
from tests.tiny_models import write_eagle3_head
from semspec.types import NGRAM_DRAFT, GenerationConfig
from semspec.engine import speculation
from semspec.engine.token_engine import CPU_SPECULATION_MAX_BATCH, VLLMEngine
from semspec.engine.speculation import (SUFFIX_INSTALL, SUFFIX_SETTINGS, draft_problem, mtp_layers,
                                        speculative_config)
from tests.conftest import require_vllm

PROMPTS = ["What is 2+2?", "Name three colours.", [{"role": "user", "content": "Count to five."}],
           "Tell me a story about a cat.", "Why is the sky blue?"]
GREEDY = GenerationConfig(method="token_sd", max_new_tokens=40, draft_tokens=3, step_delimiter=" ", max_step_tokens=8)


@pytest.mark.slow
@pytest.mark.real_model
def test_the_shipped_head_drafts_smollm2_in_vllm(tmp_path_factory):
    """The shipped head, exported, keeps drafted tokens in vLLM as it does in the embedded
    engine (about 1.5 of 4 per verification there; a wrongly ported head keeps ~0). First in
    the module: no other engine may live beside it (vLLM's state is per process)."""
    require_vllm()
    eng = VLLMEngine.load(None, draft=EMBEDDED_HEAD, device="cpu", dtype="float32", batch_size=2, kv_cache_gb=0.5,
                          speculative_tokens=4)
    try:
        config = GenerationConfig(method="token_sd", max_new_tokens=64, draft_tokens=4)
        done = _results(eng, ["Natalia sold clips to 48 of her friends in April, and then she sold half as many "
                              "clips in May. How many clips did Natalia sell altogether in April and May?",
                              "A robe takes 2 bolts of blue fiber and half that much white fiber. How many "
                              "bolts in total does it take?"], config, batch_size=1)  # alone: a CPU drafts
        c = [d.result.counters for d in done.values()]
        verifications = sum(x.target_forward_passes - 1 for x in c)
        assert sum(x.accepted_tokens for x in c) / verifications > 0.8
    finally:
        del eng
        gc.collect()


def write_head(path: Path, target_dir: Path) -> Path:
    """A head on the target in ``target_dir`` (saved with its signature, as a trained one):
    its last layer with every weight nudged (Qwen2's q/k/v biases, zero in a random target, and
    Qwen3's q/k norms among them: a drafter that drops one differs), the state passed through
    plus a little of the token's embedding (so the export's column order matters), half the
    vocabulary (so the reduced LM head is exercised)."""
    from transformers import AutoModelForCausalLM

    from semspec.head import HeadModel, save_head, target_fingerprint

    target = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32)
    torch.manual_seed(0)
    head = HeadModel(target, layers=1)
    hidden = target.config.hidden_size
    with torch.no_grad():
        for weight in head.layers.parameters():  # norms and biases further than the matrices
            weight.add_(torch.randn_like(weight) * (0.02 if weight.dim() > 1 else 0.2))
        head.fc.weight[:, hidden:].normal_(0, 0.02)
        head.fc.bias.normal_(0, 0.02)
    vocab = torch.arange(0, target.config.vocab_size, 2)
    return save_head(head, vocab, {"target": target_fingerprint(target)}, path)


@pytest.fixture(scope="module")
def tiny_head_dir(tiny_vllm_dir, tmp_path_factory):
    """write_head's head on the tiny target."""
    return write_head(tmp_path_factory.mktemp("head"), tiny_vllm_dir)


@pytest.fixture(scope="module", params=["head", NGRAM_DRAFT])
def engine(request, tiny_vllm_dir, tiny_head_dir, tiny_cache):
    require_vllm()
    draft = str(tiny_head_dir) if request.param == "head" else NGRAM_DRAFT
    eng = VLLMEngine.load(str(tiny_vllm_dir), draft=draft, device="cpu", cache_dir=tiny_cache, dtype="float32",
                          batch_size=8, kv_cache_gb=0.25, speculative_tokens=3)
    yield eng
    del eng
    gc.collect()


def _results(engine, prompts, config, batch_size=8):
    return {d.key: d for d in engine.generate_many(prompts, config, batch_size=batch_size)}


def test_greedy_text_is_the_targets_own(engine, tiny_vllm_greedy):
    """Lossless: float32 greedy token_sd writes what the target alone writes (transformers'
    greedy generate on the same weights), and its counters add up over the step log. One
    request at a time: beside others a CPU engine drafts nothing (the next test)."""
    got = _results(engine, PROMPTS, GREEDY, batch_size=1)
    drafted = 0
    for key, prompt in enumerate(PROMPTS):
        mine = got[key].result
        text, finish, _ = tiny_vllm_greedy(prompt, GREEDY.max_new_tokens)
        assert (mine.text, mine.finish_reason) == (text, finish)
        c = mine.counters
        assert c.accepted_tokens <= c.drafted_tokens <= 3 * c.target_forward_passes
        if engine.speculation.method == "eagle":  # a head drafts at every step: each is placed
            assert c.drafted_tokens == sum(s.drafted_tokens for s in mine.steps)
            assert c.accepted_tokens == sum(s.accepted_tokens for s in mine.steps)
        assert c.target_forward_passes + c.accepted_tokens >= c.generated_tokens
        assert {s.decision for s in mine.steps} == {"token_verified"}
        drafted += c.drafted_tokens
    if engine.speculation.method == "eagle":
        assert drafted > 0 and engine.identities["draft"].startswith(str(engine.speculation.draft.name))


def test_beside_other_requests_a_cpu_engine_drafts_nothing(engine, tiny_vllm_greedy):
    """On a CPU a verification beside other rows costs about its drafted tokens' work, so an
    engine drafts only while few requests run (token_engine.CPU_SPECULATION_MAX_BATCH): one
    more that end together never run with fewer, and write the target's text without a draft."""
    got = _results(engine, [PROMPTS[0]] * (CPU_SPECULATION_MAX_BATCH + 1), GREEDY)
    text, finish, _ = tiny_vllm_greedy(PROMPTS[0], GREEDY.max_new_tokens)
    for done in got.values():
        assert (done.result.text, done.result.finish_reason) == (text, finish)
        assert done.result.counters.drafted_tokens == 0 < done.result.counters.generated_tokens
    if engine.speculation.method == "eagle":  # alone, the same request drafts (ngram may find nothing)
        assert engine.generate(PROMPTS[0], GREEDY).counters.drafted_tokens > 0


def test_sampled_requests_follow_their_seeds(engine):
    """Seeds select the draws: a rerun of a seeded sample writes the same text (on vLLM's CPU
    build only with semspec.engine.vllm_cpu_fixes: its drafted positions' temperatures were
    read from uninitialised memory), another seed another text."""
    sampled = GenerationConfig(**{**GREEDY.__dict__, "temperature": 1.0, "top_p": 0.95, "seed": 11})
    first = engine.generate(PROMPTS[2], sampled)
    assert engine.generate(PROMPTS[2], sampled).text == first.text
    reseeded = engine.generate(PROMPTS[2], GenerationConfig(**{**sampled.__dict__, "seed": 12}))
    assert first.text != reseeded.text and first.counters.generated_tokens > 0


def test_a_continued_prompt_reads_every_whole_cached_block(engine):
    """A request that continues an earlier one's text (the step methods' writer makes one per
    step it writes; n samples share their prompt) reads all of its whole KV blocks from the
    cache: for a head vLLM would recompute the last one (token_engine.HEAD_METHODS), on a CPU
    up to 32 tokens more of prefill per request. The head's cache there may be stale; the text
    is still the target's (greedy: the same whether the prompt was cached or not)."""
    from vllm import SamplingParams

    from semspec.engine.token_engine import CPU_BLOCK_SIZE

    def run(ids: list[int], key: str, tokens: int = 24):
        engine.llm.add_request(key, {"prompt_token_ids": ids}, SamplingParams(temperature=0, max_tokens=tokens))
        finished = None
        while engine.llm.has_unfinished_requests():
            finished = next((o for o in engine.llm.step() if o.finished), finished)
        return finished

    prompt = engine.tokenizer("Tell me a long story about a cat who learns to count. " * 4)["input_ids"]
    continued = prompt + list(run(prompt, "first").outputs[0].token_ids)
    # a request's last drafted tokens are never cached: one over the whole text caches its blocks
    run(continued, "cached", tokens=1)
    again = run(continued, "continued")
    assert again.num_cached_tokens == (len(continued) - 1) // CPU_BLOCK_SIZE * CPU_BLOCK_SIZE > 0
    assert engine.llm.reset_prefix_cache()
    uncached = run(continued, "uncached")
    assert uncached.num_cached_tokens == 0
    assert list(uncached.outputs[0].token_ids) == list(again.outputs[0].token_ids)


def test_it_serves_token_sd_only_with_its_own_draft_count(engine):
    assert engine.method_problem("token_sd") is None
    assert "without" in engine.method_problem("ar")
    (done,) = engine.generate_many([PROMPTS[0]], GenerationConfig(**{**GREEDY.__dict__, "draft_tokens": 5}))
    assert done.error is not None and "drafts 3" in str(done.error)


def test_vllm_drafts_with_a_head_or_ngram_only(tiny_head_dir):
    assert draft_problem(None) is None and draft_problem(EMBEDDED_HEAD) is None
    assert draft_problem(NGRAM_DRAFT, "some/model") is None and draft_problem(str(tiny_head_dir), "some/model") is None
    assert "neither" in draft_problem("embedded:smollm2-135m-draft")
    assert "no draft is configured" in draft_problem(None, "some/model")
    assert "no draft is configured" in draft_problem("none")  # as the step methods read it


def test_the_export_reorders_the_fused_input_and_refuses_another_target(tiny_head_dir, tiny_vllm_dir, tmp_path):
    from safetensors.torch import load_file

    from semspec.head import HeadMismatchError
    from semspec.engine.head_plugin import ARCHITECTURE, export_head

    out = export_head(tiny_head_dir, tiny_vllm_dir, tmp_path / "export")
    mine, theirs = load_file(str(out / "model.safetensors")), load_file(str(tiny_head_dir / "head.safetensors"))
    # vLLM feeds (embedding, state); the head was trained on (state, embedding)
    assert torch.equal(mine["fc.weight"], torch.cat([theirs["fc.weight"][:, 256:], theirs["fc.weight"][:, :256]], 1))
    assert torch.equal(mine["vocab_ids"], theirs["vocab_ids"])
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == [ARCHITECTURE] and config["num_hidden_layers"] == 1
    other = tmp_path / "other"
    other.mkdir()
    (other / "config.json").write_text(json.dumps({**config, "hidden_size": 512}))
    with pytest.raises(HeadMismatchError, match="hidden_size"):
        export_head(tiny_head_dir, other, tmp_path / "export2")


# --------------------------------------------------------------------------- every vLLM draft kind

TARGET_SHA = "0" * 64


def _copy_with_config(source: Path, dest: Path, **changes) -> Path:
    """``source`` copied to ``dest`` with ``changes`` made to its config.json."""
    shutil.copytree(source, dest)
    config = json.loads((dest / "config.json").read_text())
    (dest / "config.json").write_text(json.dumps({**config, **changes}))
    return dest


@pytest.fixture(scope="module")
def drafts(tiny_vllm_dir, tmp_path_factory) -> dict[str, Path]:
    """Drafts for the tiny target, one of each layout (no directory's name holds "eagle",
    from which vLLM guesses a method when none is named)."""
    from tests.tiny_models import tiny_model_dir

    root = tmp_path_factory.mktemp("drafts")
    small = tiny_model_dir(root / "small", num_layers=1, hidden_size=256, seed=4)
    head3 = write_eagle3_head(root / "head3", tiny_vllm_dir)
    reduced = _copy_with_config(small, root / "reduced")
    (reduced / "semspec_vocab.json").write_text(json.dumps({"token_ids": list(range(0, 320, 2))}))
    pickled = shutil.copytree(small, root / "pickled", ignore=shutil.ignore_patterns("*.safetensors"))
    (pickled / "pytorch_model.bin").write_bytes(b"never loaded")
    return {
        "small": small,  # a small model of the target's tokenizer
        "other": tiny_model_dir(root / "other", num_layers=1, hidden_size=256, seed=5, vocab_size=300,
                                seed_text="A different corpus makes different merges."),
        # the target's tokenizer, its embedding padded (as Qwen2.5-32B's against 1.5B's)
        "padded": _copy_with_config(small, root / "padded", vocab_size=384),
        "head3": head3,
        "head3_suffixed": _copy_with_config(head3, root / "head3s", architectures=["LlamaForCausalLMEagle3"]),
        "head1": _copy_with_config(head3, root / "head1", architectures=["EagleLlamaForCausalLM"]),
        # a head whose config names the plain architecture (as EAGLE-1's published heads)
        "plain_head": _copy_with_config(head3, root / "plainhead", architectures=["LlamaForCausalLM"]),
        "speculators": write_eagle3_head(root / "spec", tiny_vllm_dir, layout="speculators"),
        "dflash": write_eagle3_head(root / "dflash", tiny_vllm_dir, layout="speculators", speculators_type="dflash"),
        "reduced": reduced,
        "pickled": pickled,
        "mtp_target": _copy_with_config(tiny_vllm_dir, root / "mtptarget", num_nextn_predict_layers=1),
    }


def _build(draft: str, target_dir: Path, cache: Path) -> tuple[dict, ModelIdentity]:
    return speculative_config(draft, str(target_dir), 3, target_dir, TARGET_SHA, cache)


@pytest.mark.parametrize("name, method, extra", [
    ("small", "draft_model", {}),
    ("padded", "draft_model", {"use_heterogeneous_vocab": True}),  # vLLM refuses unequal sizes otherwise
    ("head3", "eagle3", {}),
    ("head3_suffixed", "eagle3", {}),
    ("head1", "eagle", {}),
    ("speculators", "eagle3", {}),
])
def test_a_model_drafts_with_the_method_its_config_names(drafts, tiny_vllm_dir, tiny_cache, name, method, extra):
    spec = str(drafts[name])
    config, identity = _build(spec, tiny_vllm_dir, tiny_cache)
    assert config == {"method": method, "model": str(drafts[name].resolve()), "num_speculative_tokens": 3, **extra}
    layout = "speculators" if name == "speculators" else "plain"
    assert identity.name == spec
    assert identity.sha256 == derived_sha256(f"vllm-{method}", layout, spec_sha256(spec, tiny_cache))
    assert draft_problem(spec, str(tiny_vllm_dir), tiny_cache) is None


def test_the_kind_may_be_named_before_the_model(drafts, tiny_vllm_dir, tiny_cache):
    for name, kind in (("head3", "eagle3"), ("speculators", "eagle3"), ("small", "draft_model")):
        named = _build(f"{kind}:{drafts[name]}", tiny_vllm_dir, tiny_cache)
        assert named == _build(str(drafts[name]), tiny_vllm_dir, tiny_cache)  # identities compare by hash
        assert named[1].name == f"{kind}:{drafts[name]}"
    # a head whose config names a plain architecture drafts as the method named, and only so
    for kind in ("eagle", "eagle3"):
        assert _build(f"{kind}:{drafts['plain_head']}", tiny_vllm_dir, tiny_cache)[0]["method"] == kind
    for kind in ("suffix", "mtp", NGRAM_DRAFT):
        assert draft_problem(f"{kind}:", str(tiny_vllm_dir), tiny_cache).endswith(f"write {kind!r} alone")


def test_a_drafts_identity_is_its_weights_and_kind_never_its_path(drafts, tiny_vllm_dir, tiny_cache, tmp_path):
    moved = shutil.copytree(drafts["head3"], tmp_path / "elsewhere")
    sha = _build(str(drafts["head3"]), tiny_vllm_dir, tiny_cache)[1].sha256
    assert _build(str(moved), tiny_vllm_dir, tiny_cache)[1].sha256 == sha
    # the same weights run as another method, or read from the other layout, are another draft
    others = {_build(spec, tiny_vllm_dir, tiny_cache)[1].sha256
              for spec in (f"eagle:{drafts['plain_head']}", str(drafts["speculators"]))}
    assert len(others) == 2 and sha not in others
    assert _build(f"eagle3:{drafts['plain_head']}", tiny_vllm_dir, tiny_cache)[1].sha256 == sha


def test_a_draft_named_by_hub_name_resolves_offline_and_names_its_commit(drafts, tiny_vllm_dir, tiny_cache,
                                                                           tmp_path, monkeypatch):
    from tests.tiny_models import HUB_COMMIT, lay_out_hub_cache, use_hub_cache

    hub = tmp_path / "hf"
    snapshots = {name: lay_out_hub_cache(hub, f"org/{name}", drafts[name]) for name in ("small", "head3")}
    use_hub_cache(monkeypatch, hub)
    for spec, name, method in (("org/small@main", "small", "draft_model"), ("eagle3:org/head3", "head3", "eagle3")):
        assert draft_problem(spec, str(tiny_vllm_dir), tiny_cache) is None
        config, identity = _build(spec, tiny_vllm_dir, tiny_cache)
        assert (config["method"], config["model"]) == (method, str(snapshots[name].resolve()))
        assert identity.name == f"{spec.partition('@')[0]}@{HUB_COMMIT}"
        assert identity.sha256 == derived_sha256(f"vllm-{method}", "plain", spec_sha256(spec.split(":")[-1], tiny_cache))
    assert "is not in the Hugging Face cache" in draft_problem("eagle3:org/absent", str(tiny_vllm_dir), tiny_cache)


@pytest.mark.parametrize("spec, reason", [
    ("{other}", "a draft_model must share the target's tokenizer, and '{other}' (300 tokens) tokenizes otherwise"),
    ("draft_model:{other}", "must share the target's tokenizer"),
    ("eagle:{head3}", "'{head3}' is an eagle3 head (its config.json), not eagle"),
    ("draft_model:{head3}", "is an eagle3 head (its config.json), not draft_model"),
    ("eagle3:{head1}", "is an eagle head (its config.json), not eagle3"),
    ("eagle3:", "eagle3: names no model (write eagle3:MODEL)"),
    ("{dflash}", "a speculators-format head of type 'dflash'; token_sd drafts with type 'eagle3' ones"),
    ("mtp", "mtp drafts with the target's own multi-token-prediction layers, and '{target}' declares none"),
    ("{reduced}", "predicts a reduced vocabulary (semspec_vocab.json)"),
    (EMBEDDED_DRAFT, "predicts a reduced vocabulary"),  # told by name: the layer draft is not materialised
    ("{pickled}", "{pickled} holds no *.safetensors weights"),
    ("{missing}", "{missing} does not exist"),
])
def test_a_draft_that_cannot_run_is_refused_with_its_reason(drafts, tiny_vllm_dir, tiny_cache, tmp_path, spec, reason):
    names = {**{k: str(v) for k, v in drafts.items()}, "target": str(tiny_vllm_dir), "missing": str(tmp_path / "no")}
    spec, reason = spec.format(**names), reason.format(**names)
    problem = draft_problem(spec, str(tiny_vllm_dir), tiny_cache)
    assert problem.startswith(f"token_sd cannot draft with {spec!r}: ") and reason in problem
    with pytest.raises(ValueError) as refused:  # nothing is exported or resolved for vLLM
        _build(spec, tiny_vllm_dir, tiny_cache)
    assert str(refused.value) == problem


def test_suffix_decoding_runs_where_its_package_is_installed(tiny_vllm_dir, tiny_cache, monkeypatch):
    monkeypatch.setattr(speculation, "suffix_installed", lambda: False)
    problem = draft_problem("suffix", str(tiny_vllm_dir), tiny_cache)
    assert "needs the arctic_inference package, which is not installed here" in problem and SUFFIX_INSTALL in problem
    monkeypatch.setattr(speculation, "suffix_installed", lambda: True)
    config, identity = _build("suffix", tiny_vllm_dir, tiny_cache)
    assert config == {"method": "suffix", "num_speculative_tokens": 3, **SUFFIX_SETTINGS}
    settings = [f"{name}={value}" for name, value in sorted(SUFFIX_SETTINGS.items())]
    assert identity == ModelIdentity("suffix", derived_sha256("vllm-suffix", *settings))


def test_mtp_drafts_where_the_target_declares_mtp_layers(drafts, tiny_cache):
    target = drafts["mtp_target"]
    assert draft_problem("mtp", str(target), tiny_cache) is None
    config, identity = _build("mtp", target, tiny_cache)
    # no model named: vLLM loads the target's own MTP layers
    assert config == {"method": "mtp", "num_speculative_tokens": 3}
    assert identity == ModelIdentity("mtp", derived_sha256("vllm-mtp", TARGET_SHA))
    # where vLLM 0.32.0 reads the count in other families' configs (Qwen3.5's, Inkling's)
    assert mtp_layers({"text_config": {"mtp_num_hidden_layers": 1}}) == 1
    assert mtp_layers({"mtp_config": {"num_nextn_predict_layers": 2}}) == 2
    assert mtp_layers({"num_nextn_predict_layers": 0, "model_type": "qwen3"}) == 0


def test_the_head_and_ngram_keep_their_configs_and_identities(tiny_head_dir, tiny_vllm_dir, tiny_cache):
    from semspec.head import head_sha256

    require_vllm()  # a head's export registers its architecture with vLLM
    config, identity = _build(NGRAM_DRAFT, tiny_vllm_dir, tiny_cache)
    assert config == {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4, "prompt_lookup_min": 2}
    assert identity == ModelIdentity(NGRAM_DRAFT, derived_sha256("vllm-ngram", "4", "2"))
    config, identity = _build(str(tiny_head_dir), tiny_vllm_dir, tiny_cache)
    assert config["method"] == "eagle" and config["model"].startswith(str(tiny_cache))
    assert identity == ModelIdentity(str(tiny_head_dir), head_sha256(tiny_head_dir, TARGET_SHA))


def test_submit_refuses_a_token_sd_draft_of_another_tokenizer(drafts, tiny_vllm_dir, tmp_path):
    """semjobs submit's preflight (semspec.preflight) asks draft_problem, in the service's cache."""
    from semspec.preflight import method_problem

    problem = method_problem("token_sd", str(tiny_vllm_dir), str(drafts["other"]), None, tmp_path)
    assert "must share the target's tokenizer" in problem
    assert method_problem("token_sd", str(tiny_vllm_dir), f"eagle3:{drafts['head3']}", None, tmp_path) is None


def test_a_token_sd_draft_drafts_no_steps():
    for draft in ("suffix", "mtp", "eagle3:/some/head", "draft_model:/some/model"):
        problem = step_draft_problem("semspec", draft)
        assert problem is not None and "drafts tokens for token_sd" in problem
    # the model a draft setting names, where it names one (for what looks for its files)
    assert [draft_model_spec(d) for d in ("eagle3:/some/head", "/some/model", EMBEDDED_HEAD, "suffix", None)] == \
        ["/some/head", "/some/model", EMBEDDED_HEAD, None, None]
