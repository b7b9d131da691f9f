"""Fixtures shared by the calibration tests."""

import pytest

from semspec.models.loaded import load_model
from tests.tiny_models import tiny_model_dir


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    target = load_model(tiny_model_dir(root / "t", num_layers=2, hidden_size=64, seed=0), device="cpu")
    draft = load_model(tiny_model_dir(root / "d", num_layers=1, hidden_size=32, seed=1), device="cpu")
    return target, draft
