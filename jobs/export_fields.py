"""What an export holds, with no imports: the CLI builds its options from these, and
`semjobs.jobs.export` its rows and its Parquet schema."""

FORMATS = ("jsonl", "parquet", "batch", "hf")
ONLY = ("correct", "incorrect", "kept")

# The columns of a sample's row, in order: name -> (column type in Parquet and the
# dataset, what it holds). The README's "Output" table lists the same fields. Nested values
# (usage, stats, models, meta, steps) are JSON text there; ids are text.
EXPORT_FIELDS = {
    "id": ("string", "the input's id"),
    "sample": ("int64", "which of the input's samples (0-based; `--n`)"),
    "output": ("string", "everything the model generated"),
    "reasoning": ("string", "the trace before the answer: before the end-of-thinking marker, "
                            "else all but its last line"),
    "content": ("string", "the answer part: after the marker, else the trace's last line"),
    "final_answer": ("string", "the answer parsed from the output (semspec.answers), or null"),
    "reference": ("string", "the input's reference answer (its `answer`, or `metadata.answer`), or null"),
    "correct": ("bool", "final_answer checked against reference (math-verify); false when no answer "
                        "was found, null without a reference"),
    "kept": ("bool", "a sample its dataset keeps: correct with a reference; without one, ended by itself "
                     "with an answer found (not cut at the cap, not a loop); never a doomed one"),
    "finish_reason": ("string", "eos, length, repetition (a loop, cut where it began: --stop-loops) or doomed "
                                "(stopped early by the doom rule: --stop-doomed)"),
    "usage": ("string", "prompt, completion and total tokens"),
    "method": ("string", "the decoding method"),
    "stats": ("string", "the engine's counters, wall time, phase times and tokens/s of this sample"),
    "models": ("string", "the models' identities: the spec each was loaded by and the sha256 of its source"),
}
# Columns after them: the input's other fields, and the step log with --steps.
OPTIONAL_FIELDS = {"meta": ("string", "the input's other fields"), "steps": ("string", "the per-step log")}
