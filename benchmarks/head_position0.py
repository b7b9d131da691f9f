"""Why the draft head keeps fewer tokens in vLLM than in the embedded engine.

The embedded engine feeds the head one pair more than vLLM's eagle method does: at position 0
a zero state with the first prompt token (semspec.head); vLLM starts the head at the pair
(target state 0, token 1) (semspec.engine.head_plugin). This measures the shipped head on the same
greedy traces both ways, teacher-forced on the target's own states, with no engine in the way:
the mean leading run of drafted tokens the target agrees with, of K per verification, at
every response position (what a greedy verification keeps, bonus token excluded).

    python benchmarks/head_position0.py --limit 10 --max-new-tokens 256 --k 4 --out docs/benchmarks/head_position0.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch


def accepted_runs(head, rows: torch.Tensor, vocab: torch.Tensor, states: torch.Tensor, ids: torch.Tensor,
                  prompt_len: int, k: int, with_first_pair: bool) -> list[int]:
    """Per response position p: how many of the head's k drafted tokens (the first predicting
    token p + 1) lead in agreement with the target's choice. ``rows``: the LM head's rows of
    the head's vocabulary ``vocab``; ``states`` [L, H]: the target's final-norm states of ``ids`` [L]."""
    if with_first_pair:  # the embedded engine's feed: a zero state beside token 0
        states_in, inputs, shift = torch.cat([torch.zeros_like(states[:1]), states[:-1]]), ids, 0
    else:  # vLLM's: state i beside token i + 1, from i = 0
        states_in, inputs, shift = states[:-1], ids[1:], 1
    levels = head.unrolled_forward(states_in[None], inputs[None], levels=k)
    guesses = [vocab[(level[0] @ rows.T).argmax(-1)] for level in levels]
    full_rows = head.get_output_embeddings().weight.float()
    target_choice = (states @ full_rows.T).argmax(-1)  # the target's token after each position
    runs = []
    for p in range(prompt_len - 1, len(ids) - k - 1):
        n = 0
        for m in range(1, k + 1):
            at = p + m - 1  # level m at this position predicts the token after it
            if int(guesses[m - 1][at - shift]) != int(target_choice[at]):
                break
            n += 1
        runs.append(n)
    return runs


@torch.inference_mode()
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", default="semspec/assets/gsm8k/test.jsonl")
    ap.add_argument("--limit", type=int, default=10)
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--k", type=int, default=4, help="tokens drafted per verification")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from semspec.head import EMBEDDED_HEAD_DIR, HEAD_WEIGHTS, HeadModel
    from semspec.models.specs import model_directory
    from semspec.prompts import prompt_ids

    torch.set_num_threads(1)
    model_dir, _ = model_directory(None)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    target = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    tensors = load_file(str(EMBEDDED_HEAD_DIR / HEAD_WEIGHTS))
    vocab = tensors.pop("vocab_ids")
    head = HeadModel(target, layers=1, init_from_target=False)
    head.load_state_dict({name: t.float() for name, t in tensors.items()}, strict=False)
    head.eval()
    rows = target.get_output_embeddings().weight.float()[vocab]
    questions = [json.loads(line)["question"] for line in Path(args.prompts).read_text().splitlines()[:args.limit]]
    runs: dict[str, list[int]] = {"with_first_pair": [], "without_first_pair": []}
    for question in questions:
        prompt = prompt_ids(tokenizer, question, None, target.config.max_position_embeddings)
        ids = target.generate(torch.tensor([prompt]), max_new_tokens=args.max_new_tokens, do_sample=False)[0]
        states = target(ids[None], output_hidden_states=True).hidden_states[-1][0]
        for name in runs:
            runs[name] += accepted_runs(head, rows, vocab, states, ids, len(prompt), args.k, name == "with_first_pair")
    result = {name: {"mean_accepted": sum(r) / len(r), "verifications": len(r)} for name, r in runs.items()}
    result["settings"] = vars(args) | {"out": str(args.out) if args.out else None}
    print(json.dumps(result, indent=1))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
