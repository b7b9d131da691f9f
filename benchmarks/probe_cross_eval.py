"""How a probe pair's acceptance rule does on another calibration's held-out steps.

`semjobs probe train` scores the rule only with the probes it has just trained. To compare
two probe pairs on the same steps (e.g. probes calibrated with one recipe on data collected
with another), this loads a labelled calibration directory, takes the held-out questions
from the report of the probes trained on it, predicts with the given pair and scores the
rule as `probe train` does (`semspec.calibration.rule_eval.evaluate_rule`).

    python benchmarks/probe_cross_eval.py cal/layer semspec/calibration/default_probes/smollm2-135m \\
        --split-from cal/probes/report.json [--out result.json]

``--store-floor Q`` also chooses the floor on p_T as `probe train` does
(`semspec.calibration.rule_eval.choose_floor`, quantile Q of p_T on the target's own held-out
steps) and stores it with the pair (the target probe's file and report.json): how probes
trained before floors were chosen get theirs (semspec/calibration/README.md).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from semspec.calibration.rule_eval import choose_floor, evaluate_rule  # noqa: E402
from semspec.calibration.store import atomic_write_json  # noqa: E402
from semspec.calibration.train import load_role_data  # noqa: E402
from semspec.probes import ProbePair, resolve_probes  # noqa: E402


def cross_eval(cal_dir: str, probes_dir: str, split_report: str, floor_quantile: float | None = None) -> dict:
    held_out = set(json.loads(Path(split_report).read_text())["held_out_questions"])
    data = load_role_data(cal_dir)
    pair = ProbePair.load(probes_dir)
    preds, labels = {}, {}
    for role, probe in (("target", pair.target), ("draft", pair.draft)):
        rows = data[role]
        held = [i for i, q in enumerate(rows.questions) if q in held_out]
        probe.eval()
        with torch.no_grad():  # one batched pass over the held-out rows
            preds[role] = probe(rows.features[held].float()).tolist()
        labels[role] = rows.labels[held].tolist()
    sources = [s for s, q in zip(data["target"].sources, data["target"].questions) if q in held_out]
    if floor_quantile is None:
        return evaluate_rule(labels["target"], labels["draft"], preds["target"], preds["draft"], sources)
    floor = {**choose_floor(preds["target"], sources, floor_quantile), "data": cal_dir}
    result = evaluate_rule(labels["target"], labels["draft"], preds["target"], preds["draft"], sources,
                           floor=floor["tau"])
    pair.target.training_summary["floor"] = floor
    pair.target.save(Path(probes_dir) / ProbePair.TARGET_FILE)  # the draft probe stays as it is
    report_path = Path(probes_dir) / "report.json"
    report = json.loads(report_path.read_text())
    report["probes"]["target"]["floor"] = floor
    report["acceptance_rule_held_out_with_floor"] = result
    atomic_write_json(report_path, report)
    return {"floor": floor, **result}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("cal_dir", help="a collected and labelled calibration directory")
    ap.add_argument("probes_dir", help="the probe pair to score (a directory or embedded:<name>)")
    ap.add_argument("--split-from", required=True, help="report.json of probes trained on cal_dir (its held-out questions)")
    ap.add_argument("--out", help="write the result as JSON here")
    ap.add_argument("--store-floor", type=float, metavar="Q",
                    help="choose the floor on p_T at quantile Q and store it with the pair")
    args = ap.parse_args()
    result = cross_eval(args.cal_dir, str(resolve_probes(args.probes_dir)), args.split_from, args.store_floor)
    text = json.dumps(result, indent=1)
    if args.out:
        Path(args.out).write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
