"""A job's report for whoever the result is handed to: PNGs of step acceptance by step
position, of the lengths of kept steps, and of throughput over the job's life, the job's
figures as Markdown, and its manifest. Read from the database only (the engine's step log
and per-item stats), so it works while the job runs and long after."""

from __future__ import annotations

import json
import math
import os
from collections import Counter
from dataclasses import dataclass, field
from itertools import accumulate
from pathlib import Path

from semjobs.db import repo
from semjobs.db.session import session_factory
from semjobs.jobs.export import Staged, manifest_of
from semjobs.jobs.status import answers_line, fmt_duration, job_status, kept_line, render, saved_line

MAX_POSITION = 40  # steps further into a trace are rare; they share the last bar
VERIFIED = ("accepted", "rejected")  # the decisions the acceptance rule made
THROUGHPUT_BARS = 30
REPORT_FILES = ("report.md", "step_acceptance.png", "step_lengths.png", "throughput.png", "manifest.json")


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


@dataclass
class StepFigures:
    """What the report shows of a job's step log, each a count of steps."""

    drafted: Counter = field(default_factory=Counter)  # by step position (capped): verified drafts
    kept: Counter = field(default_factory=Counter)  # by step position (capped): kept drafts
    kept_lengths: Counter = field(default_factory=Counter)  # by target tokens: kept drafted steps
    written_lengths: Counter = field(default_factory=Counter)  # by target tokens: target-written steps
    decisions: Counter = field(default_factory=Counter)
    reasons: Counter = field(default_factory=Counter)  # why the target wrote an undrafted step

    @classmethod
    def of(cls, counts: repo.StepCounts) -> "StepFigures":
        f = cls()
        for (pos, decision), n in counts.by_position.items():
            if decision in VERIFIED:
                f.drafted[pos] += n
            if decision == "accepted":
                f.kept[pos] += n
        for (author, decision, tokens), n in counts.by_length.items():
            if decision == "accepted":
                f.kept_lengths[tokens] += n
            if author == "target":
                f.written_lengths[tokens] += n
        for (decision, reason), n in counts.by_reason.items():
            f.decisions[decision] += n
            if decision == "target_only" and reason:
                f.reasons[reason] += n
        return f


def plot_acceptance(figures: StepFigures, path: Path) -> None:
    """Share of drafted steps kept, by step position, with how many were drafted there."""
    plt = _plt()
    from matplotlib.ticker import MaxNLocator
    drafted, kept = figures.drafted, figures.kept
    fig, ax = plt.subplots(figsize=(8, 4))
    if drafted:
        xs = sorted(drafted)
        ax.bar(xs, [kept[x] / drafted[x] for x in xs], color="tab:blue")
        ax.set_ylim(0, 1)
        twin = ax.twinx()
        twin.plot(xs, [drafted[x] for x in xs], color="tab:gray", marker=".", linewidth=1)
        twin.set_ylim(bottom=0)
        twin.set_ylabel("drafted steps", color="tab:gray")
        ax.set_ylabel("share of drafted steps kept")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    else:
        ax.text(0.5, 0.5, "no drafted steps (the target wrote every step)", ha="center", va="center",
                transform=ax.transAxes)
    ax.set_xlabel(f"step position in the trace ({MAX_POSITION} = {MAX_POSITION} and later)")
    ax.set_title("Step acceptance by position")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_step_lengths(figures: StepFigures, path: Path) -> None:
    """Target tokens per step: drafted steps kept beside steps the target wrote."""
    plt = _plt()
    kept, written = figures.kept_lengths, figures.written_lengths
    fig, ax = plt.subplots(figsize=(8, 4))
    top = max([*kept, *written, 1])
    bins = range(0, top + 2, max(1, (top + 1) // 30))
    for lengths, label, alpha, color in ((kept, "kept drafted steps", 0.7, "tab:blue"),
                                         (written, "target-written steps", 0.5, "tab:orange")):
        if lengths:
            xs = sorted(lengths)
            ax.hist(xs, bins=bins, weights=[lengths[x] for x in xs], alpha=alpha, color=color,
                    label=f"{label} ({sum(lengths.values())})")
    ax.set_xlabel("target tokens in the step")
    ax.set_ylabel("steps")
    ax.set_title("Step lengths")
    if kept or written:
        ax.legend()
    else:
        ax.text(0.5, 0.5, "no steps logged yet", ha="center", va="center", transform=ax.transAxes)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def throughput_series(done: list[tuple], started) -> tuple[float, list[float]]:
    """Generated tokens/s over the job's life from `repo.completions`: (bar width in seconds,
    tokens/s in each bar from the job's start). Each item's tokens are spread evenly over its
    own wall time, which ends when it finished, so items decoded side by side count in the
    seconds they were decoded, not all in the one they finished in; the bars hold every token."""
    spans = []
    for ts, n, wall in done:
        end = max((ts - started).total_seconds(), 0.0)
        spans.append((max(end - wall, 0.0), end, n))
    last = max(end for _, end, _ in spans)
    bars = max(1, min(THROUGHPUT_BARS, math.ceil(last)))  # in a short job, about a second each
    width = last / bars if last > 0 else 1.0
    tokens = [0.0] * bars
    for start, end, n in spans:
        first, final = (min(int(x / width), bars - 1) for x in (start, end))
        if end <= start:  # no wall time recorded: all its tokens where it finished
            tokens[final] += n
            continue
        for b in range(first, final + 1):
            overlap = min(end, (b + 1) * width) - max(start, b * width)
            tokens[b] += n * overlap / (end - start)
    return width, [x / width for x in tokens]


def plot_throughput(done: list[tuple], started, path: Path) -> None:
    """Generated tokens/s over the job's life (throughput_series), and the tokens of the
    items finished so far."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(8, 4))
    if done and started is not None:
        width, rates = throughput_series(done, started)
        ax.bar([(b + 0.5) * width / 60 for b in range(len(rates))], rates, width=width * 0.9 / 60,
               alpha=0.3, color="tab:green")
        ax.set_ylabel("generated tokens/s", color="tab:green")
        twin = ax.twinx()
        twin.plot([(ts - started).total_seconds() / 60 for ts, _, _ in done],
                  list(accumulate(n for _, n, _ in done)), color="tab:blue")
        twin.set_ylabel("tokens of finished items (cumulative)", color="tab:blue")
        twin.set_ylim(bottom=0)
    else:
        ax.text(0.5, 0.5, "no finished items yet", ha="center", va="center", transform=ax.transAxes)
    ax.set_xlabel("minutes since the job started")
    ax.set_title("Throughput")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def markdown(st: dict, figures: StepFigures) -> str:
    decisions, reasons = figures.decisions, figures.reasons
    lines = [f"# Job {st['id']} — {st['name'] or ''}".rstrip(" —"), "", "```", render(st), "```", "",
             "| figure | value |", "|---|---|",
             f"| status | {st['status']} |", f"| method | {st['method']} |",
             f"| items | {st['n_items']} ({st['counts']['done']} done, {st['counts']['failed']} failed) |",
             f"| generated tokens | {st['generated_tokens']} |",
             f"| tokens/s overall (generated / elapsed) | {st['tokens_per_s']} |",
             f"| tokens/s per item (generated / summed item wall times) | {st['decode_tokens_per_s']} |",
             f"| elapsed | {fmt_duration(st['elapsed_s'])} |",
             f"| step acceptance | {st['acceptance']['step_acceptance']} |",
             f"| steps by decision | {', '.join(f'{k} {v}' for k, v in sorted(decisions.items())) or '-'} |",
             f"| target-only steps by reason | {', '.join(f'{k} {v}' for k, v in sorted(reasons.items())) or '-'} |"]
    if st.get("answers"):
        lines.append(f"| answers | {answers_line(st['answers'])} |")
    y = st["yield"]
    lines += [f"| kept | {kept_line(y)} |",
              f"| inputs by share of samples kept | {', '.join(f'{k} {v}' for k, v in y['pass_rates'].items())} |"]
    if saved_line(y):
        lines.append(f"| tokens spared (estimate) | {saved_line(y)} |")
    lines += ["", "![step acceptance](step_acceptance.png)", "", "![step lengths](step_lengths.png)", "",
              "![throughput](throughput.png)", "", "Manifest (models, hashes, settings): `manifest.json`.", ""]
    return "\n".join(lines)


def write_report(job_id: str, out_dir: str | Path, *, url: str | None = None, force: bool = False) -> Path:
    """Write REPORT_FILES into ``out_dir``, each whole (semjobs.jobs.export.Staged), replacing
    existing ones only with ``force``; returns it."""
    out = Path(out_dir)
    existing = [out / name for name in REPORT_FILES if os.path.lexists(out / name)]
    if existing and not force:
        raise ValueError(f"{existing[0]} exists: give --force to replace the report in {out}")
    out.mkdir(parents=True, exist_ok=True)
    st = job_status(job_id, url=url)
    if st is None:
        raise KeyError(job_id)
    with session_factory(url)() as session:
        figures = StepFigures.of(repo.step_counts(session, job_id, MAX_POSITION))
        done = repo.completions(session, job_id)
        started = repo.as_utc(repo.get_job(session, job_id).started_at)
    with Staged() as staged:
        md, acceptance, lengths, throughput, manifest = (staged.file(out / name) for name in REPORT_FILES)
        plot_acceptance(figures, acceptance)
        plot_step_lengths(figures, lengths)
        plot_throughput(done, started, throughput)
        md.write_text(markdown(st, figures), encoding="utf-8")
        manifest.write_text(json.dumps(manifest_of(job_id, url=url), indent=2, default=str) + "\n")
    return out
