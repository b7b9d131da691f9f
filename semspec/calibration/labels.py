"""Meaning clusters and semantic-probability labels for calibration samples.

For one prefix we hold N next steps sampled from the target and N from the draft. All 2N
are grouped into meaning clusters with a judge; a sample's labels are the fractions of the
target's and of the draft's samples that fall in its cluster:

    label_target(s) = |cluster(s) ∩ target samples| / N_target   (estimates p_T of s's meaning)
    label_draft(s)  = |cluster(s) ∩ draft samples|  / N_draft    (estimates p_D)

The target probe learns label_target from the target's hidden states over *any* step (also
the draft's ones, which is what it sees when decoding), and the draft probe likewise.
"""

from __future__ import annotations

from typing import Sequence

from semspec.calibration.judge import Judge


def cluster_matrix(eq: Sequence[Sequence[bool]]) -> list[int]:
    """Greedy clustering: each item joins the first cluster whose representative (first
    member) it is equivalent to, in both directions; otherwise it opens a new cluster.
    Returns a cluster id per item, numbered in order of first appearance."""
    reps: list[int] = []
    ids: list[int] = []
    for i in range(len(eq)):
        for cid, r in enumerate(reps):
            if eq[i][r] and eq[r][i]:
                ids.append(cid)
                break
        else:
            reps.append(i)
            ids.append(len(reps) - 1)
    return ids


def cluster(texts: Sequence[str], judge: Judge) -> list[int]:
    """Cluster ids for `texts`, grouped by meaning with `judge`."""
    if not texts:
        return []
    return cluster_matrix(judge.equivalence_matrix(list(texts)))


def frequency_labels(ids: Sequence[int], sources: Sequence[str]) -> dict[str, list[float]]:
    """Per sample, the fraction of each source's samples in its cluster.

    `sources[i]` names who sampled item i (e.g. "target" / "draft"). Returns
    {source: [label per item]}; a source with no samples gets all-zero labels.
    """
    names = sorted(set(sources))
    totals = {s: sum(1 for x in sources if x == s) for s in names}
    counts: dict[tuple[int, str], int] = {}
    for cid, src in zip(ids, sources):
        counts[(cid, src)] = counts.get((cid, src), 0) + 1
    return {
        s: [counts.get((cid, s), 0) / totals[s] if totals[s] else 0.0 for cid in ids]
        for s in names
    }


def label_samples(
    texts: Sequence[str], sources: Sequence[str], judge: Judge
) -> tuple[list[int], dict[str, list[float]]]:
    """Cluster one prefix's samples and label each with its cluster's frequency per source."""
    if len(texts) != len(sources):
        raise ValueError("texts and sources must have the same length")
    ids = cluster(texts, judge)
    return ids, frequency_labels(ids, sources)


def label_directory(root, judge: Judge, progress: bool = False) -> dict:
    """Label every prefix of a calibration directory (see `store.py`) and write labels.json.

    Returns a summary: prefixes, samples, mean clusters per prefix, mean labels per source.
    """
    from semspec.calibration.store import CalibrationStore

    store = CalibrationStore(root)
    keys = store.keys()
    if not keys:
        raise ValueError(f"{root} holds no collected prefixes")
    iterator = keys
    if progress:
        from tqdm import tqdm

        iterator = tqdm(keys, desc="label", unit="prefix")
    out: dict[str, dict] = {}
    n_clusters = n_samples = 0
    sums: dict[str, float] = {}
    for key in iterator:
        rec = store.read_prefix(key, with_features=False)
        ids, labels = label_samples([t.strip() for t in rec.texts], rec.sources, judge)
        out[key] = {"clusters": ids, **labels}
        n_clusters += len(set(ids))
        n_samples += len(ids)
        for src, vals in labels.items():
            sums[src] = sums.get(src, 0.0) + sum(vals)
    store.write_labels(judge.describe(), out)
    return {
        "prefixes": len(keys),
        "samples": n_samples,
        "mean_clusters_per_prefix": n_clusters / len(keys),
        "mean_label": {src: s / max(1, n_samples) for src, s in sums.items()},
    }
