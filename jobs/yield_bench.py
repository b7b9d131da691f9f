"""The yield benchmark (`semjobs bench --yield`): what a dataset builder pays per sample kept,
not per token. On the same problems, seeds and sampling, three arms per method:

- ``fixed_n``: `semjobs run --n N --keep-loops` (every sample decoded to its end), filtered;
- ``vllm_fixed_n``: plain vLLM's ``generate`` with ``n=N`` (``semjobs.jobs.yield_vllm``; the
  method's own engine plays no part, so it runs once and stands under every method), filtered;
- ``want_k``: `semjobs run --n N --want K` (an input's other samples not decoded once K are
  kept; loops stopped; with ``--doom-rule``, doomed samples stopped early: its ``doomed``
  figures say how many right samples the rule cost, by the same sample of ``fixed_n``).

Every arm's samples are filtered by one rule, ``semspec.answers.is_kept``; a sample is
useful when kept, at most K per input. Figures: useful samples per hour of generation and
per million generated tokens, inputs with one kept sample and with K.

Generation time excludes engine start-up: a semjobs job is timed from its start (its first
item claimed, once the engines have loaded) to its end (``job_status``'s ``elapsed_s``);
plain vLLM from when every process has loaded to when the last finishes. Tokens: everything
the engine generated, a semjobs job's cut and aborted samples' tokens included
(``job_status()["yield"]["spent_tokens"]``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

from semspec.answers import is_correct, is_kept

ARMS = ("fixed_n", "vllm_fixed_n", "want_k")
CPU_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_bf16", "amx_int8")


@dataclass
class YieldSettings:
    n: int
    want: int
    methods: tuple[str, ...] = ("ar", "semspec")
    temperature: float = 0.6
    top_p: float = 0.95
    max_new_tokens: int = 256
    batch_size: int = 32
    seed: int = 0
    # `--engine-arg`s for the semjobs runs (those from the settings reach them from the environment)
    engine_args: dict = field(default_factory=dict)
    draft_engine_args: dict = field(default_factory=dict)
    # SEMJOBS_* variables for the semjobs runs, already set in this process's settings (the vLLM arm's)
    env: dict[str, str] = field(default_factory=dict)
    doom_rule: str | None = None  # the want_k arm's (semspec.doom), a file `semjobs doom calibrate` wrote


@dataclass(frozen=True)
class Sample:
    """One decoded sample, as the keep rule reads it."""

    input_id: str
    correct: bool | None  # is_correct against the input's reference; None without one
    final_answer: str | None
    finish_reason: str

    @property
    def kept(self) -> bool:
        return is_kept(self.correct, self.final_answer, self.finish_reason)


def figures(samples: list[Sample], input_ids: list[str], want: int, wall_seconds: float,
            generated_tokens: int) -> dict:
    """An arm's figures from its decoded samples."""
    kept = Counter(s.input_id for s in samples if s.kept)
    useful = sum(min(k, want) for k in kept.values())
    checked = [s for s in samples if s.kept and s.correct is not None]
    # what the rule keeps where there is no reference (an answer, then EOS), checked where there is
    unchecked_rule = [s for s in samples if s.correct is not None and is_kept(None, s.final_answer, s.finish_reason)]
    return {
        "useful": useful,
        "useful_per_hour": round(useful * 3600 / wall_seconds, 2) if wall_seconds else None,
        "useful_per_mtok": round(useful * 1e6 / generated_tokens, 2) if generated_tokens else None,
        "covered_inputs": sum(1 for i in input_ids if kept[i] >= 1),
        "full_inputs": sum(1 for i in input_ids if kept[i] >= want),
        "inputs": len(input_ids),
        "kept_samples": sum(kept.values()),
        "decoded_samples": len(samples),
        "generated_tokens": generated_tokens,
        "wall_seconds": round(wall_seconds, 2),
        # with a reference a kept sample is a correct one (is_kept), so 1.0 unless the rule changes
        "kept_correct_share": _share(sum(bool(s.correct) for s in checked), len(checked)),
        "eos_answer_correct_share": _share(sum(bool(s.correct) for s in unchecked_rule), len(unchecked_rule)),
    }


def _share(a: int, b: int) -> float | None:
    return round(a / b, 4) if b else None


def export_rows(path: Path) -> list[dict]:
    """The rows of a `semjobs run` export (JSONL)."""
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def samples_from_export(rows: list[dict]) -> list[Sample]:
    """The finished samples of a `semjobs run` export's rows."""
    return [Sample(str(r["id"]), r["correct"], r["final_answer"], r["finish_reason"]) for r in rows]


def loops(arm: str, rows: list[dict]) -> dict:
    """What the loop rule did (``want_k``: samples ended as loops) or would have done
    (``fixed_n``, decoded with loops kept: semjobs.jobs.loop_audit) to an arm's samples."""
    if arm != "fixed_n":
        return {"repetition_samples": sum(r["finish_reason"] == "repetition" for r in rows)}
    from semjobs.jobs.loop_audit import audit
    from semjobs.jobs.yield_vllm import target_source
    from semspec.engine.token_engine import model_files

    return audit(((r["output"], r["finish_reason"]) for r in rows), model_files(target_source()[0])[0])


def doomed(want_rows: list[dict], fixed_rows: list[dict]) -> dict:
    """What the doom rule stopped in ``want_k`` and what it cost: a sample's seed is a function of
    the job's seed, its input and its index, so the same sample of ``fixed_n`` (decoded to its
    end) says whether a stopped one would have ended right. ``recall``: of the right samples of
    ``fixed_n`` that ``want_k`` decoded, the share not stopped (batches differ between the runs,
    so a sample's tokens can part from its twin's: an estimate)."""
    right = {(str(r["id"]), r["sample"]) for r in fixed_rows if r["correct"]}
    stopped = [(str(r["id"]), r["sample"]) for r in want_rows if r["finish_reason"] == "doomed"]
    decoded_right = [(str(r["id"]), r["sample"]) in right for r in want_rows]
    lost = sum(key in right for key in stopped)
    return {"samples": len(stopped),
            "tokens": sum(r["usage"]["completion_tokens"] for r in want_rows if r["finish_reason"] == "doomed"),
            "right_stopped": lost, "right_decoded": sum(decoded_right),
            "recall": _share(sum(decoded_right) - lost, sum(decoded_right))}


def semjobs_command(arm: str, method: str, s: YieldSettings, problems: Path, output: Path, db_url: str) -> list[str]:
    """`semjobs run` as a user would type it for ``arm``."""
    choice = ["--want", str(s.want)] if arm == "want_k" else ["--keep-loops", "--keep-doomed"]
    passed = [a for opt, args in (("--engine-arg", s.engine_args), ("--draft-engine-arg", s.draft_engine_args))
              for k, v in args.items() for a in (opt, f"{k}={json.dumps(v)}")]
    return [sys.executable, "-m", "semjobs.cli", "run", str(problems), "-o", str(output), "--db", db_url,
            "--n", str(s.n), *choice, "--method", method, "--temperature", str(s.temperature),
            "--top-p", str(s.top_p), "--max-new-tokens", str(s.max_new_tokens), "--batch-size", str(s.batch_size),
            "--seed", str(s.seed), "--no-resume", "--force", *passed]


def semjobs_arm(arm: str, method: str, s: YieldSettings, problems: Path, input_ids: list[str], out: Path) -> dict:
    """Run ``arm`` (fixed_n or want_k) of ``method`` through `semjobs run`; its figures."""
    from semjobs.jobs.status import job_status

    name = f"{method}_{arm}"
    output, db, log = out / f"{name}.jsonl", out / f"{name}.sqlite", out / f"{name}.log"
    for stale in (db, db.with_name(db.name + "-wal"), db.with_name(db.name + "-shm")):
        stale.unlink(missing_ok=True)  # one job per file: nothing of an earlier bench in it
    url = f"sqlite:///{db.resolve()}"
    cmd = semjobs_command(arm, method, s, problems, output, url)
    env = {**os.environ, **s.env}
    env.pop("SEMJOBS_DOOM_RULE", None)
    if arm == "want_k" and s.doom_rule:
        env["SEMJOBS_DOOM_RULE"] = str(Path(s.doom_rule).resolve())
    with open(log, "w") as err:
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=err, text=True, env=env)
    if proc.returncode not in (0, 3) or not proc.stdout.strip():  # 3: some samples failed; the rest count
        raise RuntimeError(f"`{' '.join(cmd[2:])}` exited {proc.returncode}; see {log}")
    job_id = proc.stdout.strip().splitlines()[-1]
    st = job_status(job_id, url=url)
    # elapsed_s: from the job's start (its first item claimed, the engines loaded) to its end, so
    # neither start-up nor the engines' shutdown that `run`'s "done in" counts; spent_tokens: every
    # token generated, those cut from loops and of samples aborted as unneeded too
    rows = export_rows(output)
    fig = figures(samples_from_export(rows), input_ids, s.want, st["elapsed_s"], st["yield"]["spent_tokens"])
    return {**fig, "loops": loops(arm, rows), "dtype": st["manifest"].get("identities", {}).get("dtype"), "job_id": job_id,
            "job_yield": st["yield"], "unneeded_samples": st["counts"]["unneeded"],
            "failed_samples": st["counts"]["failed"], "command": " ".join(["semjobs", *cmd[3:]])}


def vllm_arm(problems: list[dict], input_ids: list[str], s: YieldSettings) -> dict:
    """Plain vLLM with n samples per prompt (``semjobs.jobs.yield_vllm``); its figures."""
    from semjobs.jobs import yield_vllm

    decoded, wall, args = yield_vllm.run(problems, s.n, s.temperature, s.top_p, s.max_new_tokens, s.seed,
                                         s.batch_size)
    refs = {str(p["id"]): p.get("answer") for p in problems}
    samples = [Sample(d.input_id, is_correct(d.final_answer, refs[d.input_id]), d.final_answer, d.finish_reason)
               for d in decoded]
    fig = figures(samples, input_ids, s.want, wall, sum(d.tokens for d in decoded))
    return {**fig, "dtype": args["dtype"], "engine_args": json.loads(json.dumps(args, default=str))}


# the bench's options that pick the models and engines, by the setting each overrides
OVERRIDES = {"target": "target_model", "draft": "draft_model", "probes": "probes_dir", "device": "device",
             "dtype": "dtype", "kv_cache_gb": "kv_cache_gb", "cache_dir": "cache_dir"}


def apply_overrides(**given) -> dict[str, str]:
    """The bench's model and engine options (``OVERRIDES``; None or "auto": not given) put in
    this process's settings, for the vLLM arm; the SEMJOBS_* variables that tell the semjobs
    runs the same."""
    from semjobs.settings import settings

    env = {}
    for option, value in given.items():
        if value is not None and value != "auto":
            setattr(settings, OVERRIDES[option], value)
            env[f"SEMJOBS_{OVERRIDES[option].upper()}"] = str(value)
    return env


def cpu_flags() -> list[str]:
    """The instruction sets that decide vLLM's CPU speed and number type, of those this host has."""
    try:
        line = next(x for x in Path("/proc/cpuinfo").read_text().splitlines() if x.startswith("flags"))
    except (OSError, StopIteration):
        return []
    have = set(line.split(":", 1)[1].split())
    return [f for f in CPU_FLAGS if f in have]


def run_yield(s: YieldSettings, problems: list[dict], problems_spec: str, out: Path,
              say: Callable[[str], None], command: str | None = None, environment: dict | None = None) -> dict:
    """Every arm of every method in turn (never side by side: they would share the cores);
    writes ``out``/results.json and returns it. ``environment``: the host and versions, as
    the command reads them (``semspec.benchmark.report.environment``)."""
    from semjobs.jobs import yield_problems

    out.mkdir(parents=True, exist_ok=True)
    path = yield_problems.write(problems, out / "problems.jsonl")
    ids = [str(p["id"]) for p in problems]
    say(f"{len(problems)} problems ({problems_spec}) in {path}; plain vLLM, n {s.n}")
    plain = vllm_arm(problems, ids, s)
    say(f"vllm_fixed_n: {plain['useful']} useful in {plain['wall_seconds']}s")
    by_method = {}
    for method in s.methods:
        arms = {"vllm_fixed_n": plain}
        for arm in ("fixed_n", "want_k"):
            say(f"{method} {arm}: semjobs run")
            arms[arm] = semjobs_arm(arm, method, s, path, ids, out)
            say(f"{method} {arm}: {arms[arm]['useful']} useful in {arms[arm]['wall_seconds']}s")
        if s.doom_rule:  # the exports semjobs_arm left
            arms["want_k"]["doomed"] = doomed(export_rows(out / f"{method}_want_k.jsonl"),
                                              export_rows(out / f"{method}_fixed_n.jsonl"))
        by_method[method] = {arm: arms[arm] for arm in ARMS}
    results = {
        "command": command,
        "settings": {**{k: v for k, v in asdict(s).items() if k != "env"}, "overrides": s.env,
                     "problems": problems_spec, "problems_file": str(path), "cpu_flags": cpu_flags(),
                     "wall_seconds": "generation only, engine start-up excluded"},
        "problems": yield_problems.kinds(problems),
        "environment": environment,
        "yield": by_method,
    }
    (out / "results.json").write_text(json.dumps(results, indent=1))
    return results


def table(results: dict) -> str:
    """The figures as a short text table."""
    head = (f"{'method':<10} {'arm':<13} {'useful':>6} {'/hour':>8} {'/Mtok':>8} {'covered':>8} {'full':>5} "
            f"{'kept':>5} {'tokens':>8} {'wall s':>7}")
    lines = [head]
    for method, arms in results["yield"].items():
        for arm, f in arms.items():
            lines.append(f"{method:<10} {arm:<13} {f['useful']:>6} {f['useful_per_hour'] or 0:>8.1f} "
                         f"{f['useful_per_mtok'] or 0:>8.1f} {f['covered_inputs']:>4}/{f['inputs']:<3} "
                         f"{f['full_inputs']:>5} {f['kept_samples']:>5} {f['generated_tokens']:>8} "
                         f"{f['wall_seconds']:>7.1f}")
    return "\n".join(lines)
