"""How much more a tree of drafts could keep than the head's chain, on questions nobody trained on.

``token_sd`` verifies one chain: the head's likeliest token at each depth. A tree (EAGLE-2's
drafts) verifies several candidates a depth in one target pass, so a run of accepted tokens
goes on wherever the target's token is among them. This measures that bound for the head:
the target answers ``--limit`` GSM8K questions after line ``--skip-lines`` greedily (by
default lines 1141 on, after the head's training questions and its probes' calibration
ones), and ``semspec.draft.head_train.evaluate_depths`` drafts ``--draft-tokens`` deep from
every 8th answer position, counting the leading depths where the target's token is the
head's top-1 (the chain: a greedy verification's accepted length, bonus excluded) and where
it is among the head's top w, for each ``--widths`` w: what verifying the full tree of w
branches a node would keep (sum over depths of w^d tokens; a dynamic tree keeps fewer nodes
and reaches less).

    python benchmarks/head_tree_bound.py --widths 2,3 --out docs/benchmarks/head/tree_bound.json
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._common import write_json  # noqa: E402
from semspec.assets import GSM8K_TEST  # noqa: E402
from semspec.draft.data import load_questions  # noqa: E402
from semspec.draft.head_data import cached_target_states, generate_traces  # noqa: E402
from semspec.draft.head_train import evaluate_depths  # noqa: E402
from semspec.head import load_head  # noqa: E402
from semspec.models import load_model  # noqa: E402
from semspec.types import GenerationConfig  # noqa: E402


def tree_bound(head_dir: str, target_spec: str, questions: list[str], widths: tuple[int, ...], draft_tokens: int,
               max_new_tokens: int, batch_size: int, cache_dir: str | None) -> dict:
    from semspec.engine import Engine

    engine = Engine.load(target_spec, draft="none", probes="none", batch_size=batch_size)
    greedy = GenerationConfig(method="ar", temperature=0.0, max_new_tokens=max_new_tokens)
    traces = generate_traces(engine, questions, greedy, "greedy", batch_size, seed=0, cache_dir=cache_dir)
    del engine
    target = load_model(target_spec, device="cpu", dtype=torch.float32)
    states = cached_target_states(target, traces, cache_dir)
    head = load_head(head_dir, target)
    ev = evaluate_depths(head.model, target, head.vocab_ids, traces, states, depths=(1, 2, 4), stride=8,
                         accept_k=draft_tokens, widths=widths)
    tree_tokens = {str(w): sum(w ** d for d in range(1, draft_tokens + 1)) for w in widths}
    answer_tokens = sum(len(t.ids) - t.prompt_len for t in traces)
    return {"head": head_dir, "questions": len(questions), "answer_tokens": answer_tokens,
            "draft_tokens": draft_tokens, "full_tree_tokens": tree_tokens, **ev}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--head", default=str(Path(__file__).resolve().parents[1] / "semspec" / "assets" / "head"))
    ap.add_argument("--target", default="embedded:smollm2-135m")
    ap.add_argument("--data", default=str(GSM8K_TEST))
    ap.add_argument("--skip-lines", type=int, default=1140)
    ap.add_argument("--limit", type=int, default=48)
    ap.add_argument("--widths", default="2,3")
    ap.add_argument("--draft-tokens", type=int, default=4, help="tree depth (the engine's default chain: 4)")
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--cache-dir", default=None, help="cache the answers and states here")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    questions = [r["question"] for r in load_questions(args.data, args.skip_lines)[: args.limit]]
    widths = tuple(int(w) for w in args.widths.split(","))
    result = tree_bound(args.head, args.target, questions, widths, args.draft_tokens, args.max_new_tokens,
                        args.batch_size, args.cache_dir)
    print(f"{result['questions']} questions, {result['answer_tokens']} answer tokens; top-1 by depth "
          f"{ {d: round(v, 3) for d, v in result['top1_by_depth'].items()} }")
    print(f"accepted of {args.draft_tokens}: chain {result['mean_accepted']:.3f}; "
          + "; ".join(f"full tree of width {w} ({result['full_tree_tokens'][w]} tokens) {v:.3f}"
                      for w, v in result["mean_accepted_within_top"].items()))
    write_json(result, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
