"""`semjobs draft train`: where the head's training stops, and options of the other kind refused."""

from click.testing import CliRunner

from semjobs.cli.draft import _stop_after
from semjobs.cli.main import main
from semspec.draft.config import HeadTrainConfig


def test_the_recipe_stops_at_its_step_and_a_schedule_given_alone_runs_whole():
    assert _stop_after(None, None) == HeadTrainConfig().stop_after == 1800  # the shipped recipe
    assert _stop_after(None, 3000) is None  # --steps 3000: all 3000, not 1800 of them
    assert _stop_after(0, None) is None  # --stop-after 0: the whole schedule
    assert _stop_after(500, 3000) == 500


def test_stop_after_is_refused_for_the_layer_draft(tmp_path):
    res = CliRunner().invoke(main, ["draft", "train", "--kind", "layers", "--out", str(tmp_path / "d"),
                                    "--stop-after", "10"])
    assert res.exit_code == 2 and "--stop-after is for --kind eagle" in res.output


def test_a_trained_layer_draft_becomes_the_model_directory_a_spec_names(tmp_path):
    import pytest
    import torch

    from semspec.draft.train import DraftStack
    from semspec.models.draft_artifact import (DraftArtifact, build_draft_model, load_artifact, save_artifact,
                                               target_checksums, target_signature)
    from semspec.models.loaded import load_model
    from semspec.models.paths import ModelLoadError
    from semspec.models.specs import resolve_spec
    from tests.tiny_models import tiny_model_dir

    target_dir = tiny_model_dir(tmp_path / "target", num_layers=2, seed=0)
    target = load_model(str(target_dir), device="cpu", dtype=torch.float32, cache_dir=tmp_path / "cache").model
    stack = DraftStack(target, 1, [1])  # as `semjobs draft train` writes one: 1 shared + 1 trained layer
    save_artifact(DraftArtifact(meta={"format": "semspec-draft/1", "frozen_layers": 1, "adapter_layers": 1,
                                      "adapter_init": [1], "target": {"signature": target_signature(target),
                                                                      "checksums": target_checksums(target, 1)}},
                                tensors=stack.export()), tmp_path / "art")
    with pytest.raises(ModelLoadError, match="a layer draft artifact.*semjobs draft materialize"):
        resolve_spec(str(tmp_path / "art"))

    def materialize(target_spec, out):
        return CliRunner().invoke(main, ["draft", "materialize", str(tmp_path / "art"), "--target", target_spec,
                                         "--out", str(out)])

    res = materialize(str(target_dir), tmp_path / "model")
    assert res.exit_code == 0, res.output
    draft = load_model(str(tmp_path / "model"), device="cpu", dtype=torch.float32, cache_dir=tmp_path / "cache")
    ids = torch.tensor([[5, 6, 7, 8]])
    with torch.no_grad():
        want = build_draft_model(target, load_artifact(tmp_path / "art"))(ids).logits
        torch.testing.assert_close(draft.model(ids).logits, want)
    again = materialize(str(target_dir), tmp_path / "model")  # never over what is there
    assert again.exit_code == 2 and "exists" in again.output
    other = tiny_model_dir(tmp_path / "other", num_layers=2, seed=1)
    wrong = materialize(str(other), tmp_path / "model2")
    assert wrong.exit_code == 1 and "was not trained on" in wrong.output and not (tmp_path / "model2").exists()
    (tmp_path / "empty").mkdir()
    res = CliRunner().invoke(main, ["draft", "materialize", str(tmp_path / "empty"), "--out", str(tmp_path / "m3")])
    assert res.exit_code == 1 and "is not a layer draft artifact" in res.output
