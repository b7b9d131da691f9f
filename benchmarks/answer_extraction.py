"""How often a final answer is found in real outputs, and how often it is right.

    python benchmarks/answer_extraction.py docs/benchmarks/latest/results.json \\
        docs/benchmarks/head/greedy/results.json docs/benchmarks/head/sampled/results.json \\
        [--baseline 69ee008]

Reads ``semjobs bench`` results (``results.json``: every prompt's reference and each
method's output text; the batch sweeps keep no texts) or a semjobs export (JSONL lines with
``output`` and ``reference``, or the input's ``meta.answer``). For each file and over all of
them it prints the share of outputs with an answer and the accuracy against the references
(``semspec.answers.is_correct``; an output without an answer counts as wrong), over all
outputs and over those that ended by EOS, for:

- ``extract_answer``: the stated-answer rules alone (boxed, ``####``, "the answer is",
  concluding sentence, bare number);
- ``final_answer``: those, else the last number in the output (what the engine and bench use);
- with ``--baseline REV``: ``extract_answer`` as it was in ``semspec/steps.py`` at git
  revision REV, for a before/after comparison.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import types
from pathlib import Path
from typing import Callable

from semspec.answers import extract_answer, final_answer, is_correct, reference_from

ROOT = Path(__file__).resolve().parents[1]
Output = tuple[str, str | None, bool]  # (text, reference, ended by EOS rather than the token budget)


def read_outputs(path: Path) -> list[Output]:
    """Every output in a bench ``results.json`` or an export JSONL."""
    if path.suffix == ".json":
        results = json.loads(path.read_text())
        return [(run["text"], prompt.get("reference"), run.get("finish_reason") == "eos")
                for prompt in results.get("prompts", []) for run in prompt.get("runs", {}).values()]
    out = []
    for line in path.read_text().splitlines():
        rec = json.loads(line) if line.strip() else {}
        if "output" in rec:  # failed items have none
            ref = rec.get("reference")
            if ref is None:  # no reference stored with the item: the input's own answer field
                ref = (rec.get("meta") or {}).get("answer")
            out.append((rec["output"], reference_from(ref), rec.get("finish_reason") == "eos"))
    return out


def baseline_extractor(rev: str) -> Callable[[str], str | None]:
    """``extract_answer`` from ``semspec/steps.py`` at git revision ``rev`` (self-contained there)."""
    source = subprocess.run(["git", "show", f"{rev}:semspec/steps.py"], cwd=ROOT, check=True,
                            capture_output=True, text=True).stdout
    module = types.ModuleType(f"steps_at_{rev}")
    sys.modules[module.__name__] = module  # its dataclasses look their module up there
    exec(compile(source, f"{rev}:semspec/steps.py", "exec"), module.__dict__)
    return module.extract_answer


def figures(outputs: list[Output], extract: Callable[[str], str | None]) -> tuple[int, int, int]:
    """(answers found, correct answers, outputs with a reference)."""
    found = correct = scored = 0
    for text, ref, _ in outputs:
        ans = extract(text)
        found += ans is not None
        if ref is not None:
            scored += 1
            correct += bool(is_correct(ans, ref))
    return found, correct, scored


def report(name: str, outputs: list[Output], extractors: dict[str, Callable]) -> None:
    distinct = len({text for text, _, _ in outputs})
    print(f"\n{name}: {len(outputs)} outputs ({distinct} distinct texts), "
          f"{sum(ref is not None for _, ref, _ in outputs)} with a reference")
    print(f"  {'rules':<34} {'outputs':<14} {'answer found':>18} {'accuracy':>18}")
    # outputs cut off by the token budget often end mid-computation: shown apart
    ended = [o for o in outputs if o[2]]
    for label, extract in extractors.items():
        for subset, chosen in (("all", outputs), ("ended by EOS", ended)):
            if not chosen:
                continue
            found, correct, scored = figures(chosen, extract)
            acc = f"{correct}/{scored} = {correct / scored:.3f}" if scored else "-"
            share = f"{found}/{len(chosen)} = {found / len(chosen):.3f}"
            print(f"  {label:<34} {subset:<14} {share:>18} {acc:>18}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="+", type=Path, help="bench results.json or semjobs export JSONL")
    ap.add_argument("--baseline", metavar="REV", help="also the extract_answer of semspec/steps.py at REV")
    args = ap.parse_args()

    extractors: dict[str, Callable] = {}
    if args.baseline:
        extractors[f"extract_answer at {args.baseline}"] = baseline_extractor(args.baseline)
    extractors["extract_answer (stated answer)"] = extract_answer
    extractors["final_answer (+ last number)"] = final_answer

    everything: list[Output] = []
    for path in args.files:
        outputs = read_outputs(path)
        everything += outputs
        report(str(path), outputs, extractors)
    if len(args.files) > 1:
        report("all files", everything, extractors)


if __name__ == "__main__":
    main()
