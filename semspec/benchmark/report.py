"""Write a bench run out: ``results.json``, ``results.md`` and PNG plots (matplotlib, Agg)."""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import subprocess
import sys
from dataclasses import asdict
from importlib import metadata
from pathlib import Path
from typing import Any

from .metrics import DEFINITIONS, summarize

SCHEMA = "semjobs-bench/1"
PLOTS = {"pareto": "pareto.png", "step_acceptance": "step_acceptance.png"}


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _version(pkg: str) -> str | None:
    try:
        return metadata.version(pkg)
    except metadata.PackageNotFoundError:
        return None


def git_commit() -> str | None:
    root = Path(__file__).resolve().parents[2]
    try:
        out = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5)
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def environment(engine=None) -> dict[str, Any]:
    import torch

    env: dict[str, Any] = {
        "cpu": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "loadavg": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "versions": {p: _version(p) for p in ("torch", "transformers", "numpy", "tokenizers", "semjobs")},
        "git_commit": git_commit(),
    }
    if engine is not None:  # a semspec.benchmark.engines.BenchEngines
        env.update(engine.describe())
    return env


def build_results(br, engine=None, command: str | None = None, env: dict | None = None) -> dict[str, Any]:
    """The ``results.json`` document of a :class:`~semspec.benchmark.runner.BenchRun`."""
    plan = {r.label: r.meta() for r in br.plan}
    summary = summarize(br.prompts, br.runs, plan, br.settings.temperature)
    for label, why in br.skipped.items():
        summary["methods"].setdefault(label, dict(plan.get(label, {})))["skipped"] = why
    per_prompt = []
    for i, p in enumerate(br.prompts):
        per_prompt.append({
            **p,
            "runs": {label: recs[i] for label, recs in br.runs.items() if recs[i] is not None},
        })
    s = asdict(br.settings)
    if engine is not None:  # record the step rule and floor the methods ran with, not "default"
        from semspec.types import GenerationConfig

        asked = GenerationConfig(method="semspec", step_delimiter=s["step_delimiter"], temperature=s["temperature"],
                                 max_step_tokens=s["max_step_tokens"])
        rule = engine.resolve(asked)
        s["step_delimiter"], s["max_step_tokens"] = rule.step_delimiter, rule.max_step_tokens
        for m in summary["methods"].values():  # a compare_drafts lane's floor is its own probes'
            if m.get("method") == "semspec" and m.get("tau") is None and "skipped" not in m:
                m["tau"] = engine.resolve(asked, m.get("draft")).tau
    env = dict(env if env is not None else environment(engine))
    if getattr(br, "git_commit", None):
        env["git_commit"] = br.git_commit  # the code that ran, not the code at report time
    return {
        "schema": SCHEMA,
        "created_at": _dt.datetime.fromtimestamp(br.started_at, _dt.timezone.utc).isoformat(timespec="seconds"),
        "command": command,
        "settings": s,
        "environment": env,
        "bench_seconds": br.seconds,
        "interrupted": br.interrupted,
        "loadavg": br.loadavg,
        "ar_self_agreement": summary["ar_self_agreement"],
        "goal": summary["goal"],
        "cost_model": summary["cost_model"],
        "methods": summary["methods"],
        "errors": br.errors,
        "definitions": DEFINITIONS,
        "prompts": per_prompt,
    }


# --------------------------------------------------------------------------- markdown


def _f(x, fmt="{:.2f}", none="–") -> str:
    if x is None:
        return none
    return fmt.format(x)


def _pct(x) -> str:
    return _f(x, "{:.0%}")


def markdown(res: dict[str, Any], plots: dict[str, str] | None = None) -> str:
    s = res["settings"]
    env = res["environment"]
    lines = [
        "# semjobs bench results",
        "",
        f"- Command: `{res.get('command') or 'semjobs bench'}`",
        f"- Prompts: {len(res['prompts'])} from `{s['prompts']}` (offset {s['offset']}); "
        f"temperature {s['temperature']}, top-p {s['top_p']}, max new tokens {s['max_new_tokens']}, seed {s['seed']}; "
        f"steps end at {s['step_delimiter']!r} or {s['max_step_tokens']} tokens",
        f"- Machine: {env.get('cpu')} ({env.get('cpu_count')} CPUs, {env.get('torch_threads')} torch threads, "
        f"1-min load average {_f((res.get('loadavg', {}).get('start') or [None])[0])} at start, "
        f"{_f((res.get('loadavg', {}).get('end') or [None])[0])} at end); torch {env['versions'].get('torch')}, "
        f"transformers {env['versions'].get('transformers')}; commit {str(env.get('git_commit'))[:10]}",
    ]
    for role, ident in (env.get("models") or {}).items():
        lines.append(f"- {role}: `{ident}`")
    if res.get("interrupted"):
        lines.append(f"- **Stopped early**: figures over the {len(res['prompts'])} prompt(s) every method finished")
    lines += [
        f"- `ar_self_agreement` (noise floor: ar vs ar with other seeds): **{_pct(res['ar_self_agreement'])}**",
        "",
        "| method | speed-up vs ar, median (mean) | per token, median | tokens/s | target passes / token | "
        "draft share | token acc. | mean acc. length (excl. bonus) | step acc. | answer agreement vs ar | "
        "accuracy | length vs ar | target log-lik. |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for label, m in res["methods"].items():
        if m.get("skipped"):
            lines.append(f"| {label} | skipped: {m['skipped']} |" + " |" * 11)
            continue
        lines.append(
            f"| {label} | {_f(m.get('speedup_vs_ar'))}× ({_f(m.get('speedup_vs_ar_mean'))}×) "
            f"| {_f(m.get('speedup_vs_ar_per_token'))}× | {_f(m.get('tokens_per_second'), '{:.1f}')} "
            f"| {_f(m.get('target_passes_per_token'))} "
            f"| {_pct(m.get('draft_time_share'))} | {_pct(m.get('token_acceptance_rate'))} "
            f"| {_f(m.get('mean_accepted_length'))} | {_pct(m.get('step_acceptance_rate'))} "
            f"| {_pct(m.get('answer_agreement_vs_ar'))} | {_pct(m.get('accuracy'))} "
            f"| {_f(m.get('output_length_vs_ar'))} | {_f(m.get('target_mean_loglik'), '{:.3f}')} |"
        )
    lines += ["", "## Where the time goes (share of wall-clock per phase)", "",
              "| method | " + " | ".join(["prefill", "draft", "verify", "judge", "target_write", "other"]) + " |",
              "|---|---|---|---|---|---|---|"]
    for label, m in res["methods"].items():
        ph = m.get("phase_share") or {}
        if not ph or str(m.get("method", "")).startswith("hf_"):
            continue
        lines.append(f"| {label} | " + " | ".join(_pct(ph.get(k)) for k in
                                                  ["prefill", "draft", "verify", "judge", "target_write", "other"]) + " |")
    cm = res.get("cost_model") or {}
    if cm:
        lines += ["", "## Unit costs measured in this run", ""]
        lines += [f"- `{k}`: {_f(v, '{:.4g}')}" for k, v in cm.items()]
    g = res.get("goal") or {}
    lines += ["", "## Goal (issue 6): semspec at its default setting", ""]
    if g.get("evaluated"):
        lines += [
            f"- speed-up {_f(g['speedup_vs_ar'])}× vs goal {g['speedup_goal']:.1f}×: "
            f"**{'met' if g['speedup_met'] else 'not met'}**",
            f"- answer agreement {_pct(g['answer_agreement_vs_ar'])} vs floor {_pct(g['agreement_floor'])} "
            f"(ar_self_agreement − 0.05): **{ {True: 'met', False: 'not met', None: 'n/a'}[g['agreement_met']] }**",
        ]
        for peer, p in g.get("peers", {}).items():
            lines.append(f"- vs {peer} ({_f(p['speedup_vs_ar'])}×, agreement {_pct(p['answer_agreement_vs_ar'])}): "
                         f"{'ahead' if p['semspec_ahead'] else 'not ahead'}")
    else:
        lines.append(f"- not evaluated: {g.get('reason')}")
    if res.get("errors"):
        lines += ["", f"## Errors ({len(res['errors'])})", ""]
        lines += [f"- {e['label']} on prompt {e['prompt_id']}: {e['error']}" for e in res["errors"][:20]]
    if plots:
        lines += ["", "## Plots", ""] + [f"![{k}]({v})" for k, v in plots.items()]
    lines += ["", "## Definitions", ""] + [f"- `{k}`: {v}" for k, v in res["definitions"].items()]
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- plots


def pareto_front(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Points not dominated in (agreement, speed-up), both higher-is-better, sorted by agreement."""
    front = [p for p in points
             if not any(q[0] >= p[0] and q[1] >= p[1] and q != p for q in points)]
    return sorted(set(front))


def plot_pareto(res: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 5))
    pts, sem = [], []
    for label, m in res["methods"].items():
        x, y = m.get("answer_agreement_vs_ar"), m.get("speedup_vs_ar")
        if x is None or y is None or label == "ar":
            continue
        pts.append((x, y))
        if m.get("method") == "semspec" and m.get("tau") is not None:  # None: no engine said which
            sem.append((m["tau"], x, y, label))
        ax.scatter([x], [y], s=40, zorder=3)
        ax.annotate(label, (x, y), textcoords="offset points", xytext=(4, 4), fontsize=8)
    if len(sem) > 1:
        sem.sort()
        ax.plot([s[1] for s in sem], [s[2] for s in sem], "-", color="tab:red", alpha=0.5, label="semspec across τ")
    front = pareto_front(pts + [(1.0, 1.0)])  # ar itself is a point of the front
    if front:
        ax.step([p[0] for p in front], [p[1] for p in front], where="post", color="grey", ls=":", label="Pareto front")
    ax.scatter([1.0], [1.0], marker="*", s=120, color="black", zorder=3)
    ax.annotate("ar", (1.0, 1.0), textcoords="offset points", xytext=(4, -10), fontsize=8)
    ax.axhline(res.get("goal", {}).get("speedup_goal", 2.0), color="tab:green", ls="--", lw=1, label="goal 2.0×")
    sa = res.get("ar_self_agreement")
    if sa is not None:
        ax.axvline(sa, color="black", ls="--", lw=1, label="ar self-agreement")
        ax.axvline(sa - 0.05, color="tab:orange", ls="--", lw=1, label="agreement floor (−0.05)")
    ax.axhline(1.0, color="grey", lw=0.5)
    ax.set_xlabel("final-answer agreement with ar")
    ax.set_ylabel("speed-up over ar (median per-prompt wall-clock ratio)")
    ax.set_title("Speed-up vs answer agreement")
    ax.set_xlim(-0.02, 1.05)
    ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_step_acceptance(res: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    any_line = False
    for label, m in res["methods"].items():
        rows = m.get("step_acceptance_by_position")
        if not rows:
            continue
        any_line = True
        ax.plot([r["position"] for r in rows], [r["rate"] for r in rows], "o-", ms=3,
                label=f"{label} ({sum(r['drafted'] for r in rows)} drafted steps)")
    if not any_line:
        ax.text(0.5, 0.5, "no drafted steps", ha="center", va="center", transform=ax.transAxes)
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.set_xlabel("step position in the trace (0 = first step; steps past 30 pooled at 30)")
    ax.set_ylabel("drafted steps accepted")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title("Step acceptance by step position")
    if any_line:
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_report(br, out_dir: str | os.PathLike, engine=None, command: str | None = None,
                 env: dict | None = None) -> dict[str, Any]:
    """Write results.json, results.md and the plots into ``out_dir``; returns the results."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    res = build_results(br, engine, command, env)
    plot_pareto(res, out / PLOTS["pareto"])
    plot_step_acceptance(res, out / PLOTS["step_acceptance"])
    res["plots"] = dict(PLOTS)
    (out / "results.json").write_text(json.dumps(res, indent=1, default=str))
    (out / "results.md").write_text(markdown(res, PLOTS))
    return res
