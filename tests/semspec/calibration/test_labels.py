import pytest

from semspec.calibration.labels import cluster, cluster_matrix, frequency_labels, label_samples


class FirstWordJudge:
    """Equivalent when the first words match (a stand-in for a semantic judge)."""

    name = "first-word"

    def equivalence_matrix(self, texts):
        keys = [t.split()[0] if t.split() else "" for t in texts]
        return [[a == b for b in keys] for a in keys]

    def equivalent(self, a, b):
        return self.equivalence_matrix([a, b])[0][1]

    def describe(self):
        return {"judge": self.name}


def test_cluster_matrix_greedy_against_representatives():
    # 0~1, 1~2 but not 0~2: 2 does not join 0's cluster through 1 (no chaining).
    eq = [[True, True, False], [True, True, True], [False, True, True]]
    assert cluster_matrix(eq) == [0, 0, 1]
    assert cluster_matrix([]) == []


def test_cluster_by_meaning():
    texts = ["a x", "b y", "a z", "c", "b"]
    assert cluster(texts, FirstWordJudge()) == [0, 1, 0, 2, 1]
    assert cluster([], FirstWordJudge()) == []


def test_frequency_labels_per_source():
    ids = [0, 0, 1, 0, 1, 2]
    src = ["target", "target", "target", "draft", "draft", "draft"]
    labels = frequency_labels(ids, src)
    assert labels["target"] == pytest.approx([2 / 3, 2 / 3, 1 / 3, 2 / 3, 1 / 3, 0.0])
    assert labels["draft"] == pytest.approx([1 / 3, 1 / 3, 1 / 3, 1 / 3, 1 / 3, 1 / 3])


def test_label_samples():
    ids, labels = label_samples(["a 1", "a 2", "b"], ["target"] * 3, FirstWordJudge())
    assert ids == [0, 0, 1]
    assert labels["target"] == pytest.approx([2 / 3, 2 / 3, 1 / 3])
    with pytest.raises(ValueError):
        label_samples(["a"], [], FirstWordJudge())


def test_label_directory(tmp_path):
    import torch

    from semspec.calibration.labels import label_directory
    from semspec.calibration.store import CalibrationStore, PrefixRecord

    store = CalibrationStore(tmp_path)
    store.init({"target": "t", "draft": "d", "samples": 2, "layer": {"target": -1, "draft": -1}})
    store.write_prefix(PrefixRecord(
        key="q1__000", question_id="q1", k=0, prompt="p", prefix_text="",
        texts=["a 1\n\n", "b", " a 2", "c"], sources=["target", "target", "draft", "draft"],
        features={"target": torch.zeros(4, 3), "draft": torch.zeros(4, 2)},
    ))
    summary = label_directory(tmp_path, FirstWordJudge())
    assert summary["prefixes"] == 1 and summary["samples"] == 4
    labels = store.read_labels()
    assert labels["judge"] == {"judge": "first-word"}
    row = labels["prefixes"]["q1__000"]
    assert row["clusters"] == [0, 1, 0, 2]
    assert row["target"] == pytest.approx([0.5, 0.5, 0.5, 0.0])
    assert row["draft"] == pytest.approx([0.5, 0.0, 0.5, 0.5])
