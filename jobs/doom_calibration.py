"""`semjobs doom calibrate`: the doom rule (``semspec.doom``) for the target the settings name,
calibrated on its own samples of problems with references.

Each problem is sampled ``n`` times to its end on plain vLLM (``semjobs.jobs.yield_vllm``: the
model directory, number type and engine arguments `semjobs run` decodes with), with every
token's top log-probabilities; each sample is right or not by the same check jobs use
(``semspec.answers.is_correct``). ``semspec.doom.calibrate`` then chooses the rule. Sample at
the temperature and token cap of the jobs the rule will serve: it learns what their wrong
samples look like.
"""

from __future__ import annotations

from semspec.answers import is_correct
from semspec.doom import KINDS, DoomRule, Trace, calibrate


def calibrate_rule(problems: list[dict], n: int, recall: float, temperature: float, top_p: float,
                   max_new_tokens: int, seed: int, batch_size: int, kinds: tuple[str, ...] = KINDS) -> DoomRule:
    """The rule of one of ``kinds`` (``semspec.doom.KINDS``) for ``problems`` (``{id, prompt or
    messages, answer}``, as the yield benchmark's)."""
    from semjobs.jobs import yield_vllm

    unchecked = [str(p["id"]) for p in problems if p.get("answer") is None]
    if unchecked:
        raise ValueError(f"{len(unchecked)} problem(s) without a reference (first: {unchecked[0]}): "
                         f"a calibration must know which samples are right")
    if temperature <= 0:
        raise ValueError("the doom rule stops sampled samples: calibrate at the jobs' temperature, above 0")
    decoded, wall, args = yield_vllm.run(problems, n, temperature, top_p, max_new_tokens, seed, batch_size,
                                         signals=True)
    refs = {str(p["id"]): p["answer"] for p in problems}
    traces = [Trace(d.signals or {}, bool(is_correct(d.final_answer, refs[d.input_id]))) for d in decoded]
    identity = yield_vllm.target_source()[1]
    return calibrate(traces, recall, str(identity), settings={
        "problems": len(problems), "n": n, "temperature": temperature, "top_p": top_p,
        "max_new_tokens": max_new_tokens, "seed": seed, "dtype": args["dtype"], "wall_seconds": round(wall, 1)},
        kinds=kinds)
