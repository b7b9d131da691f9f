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
