"""``semjobs bench``: every decoding method side by side on the same prompts, quality beside speed.

- :mod:`semspec.benchmark.engines` — loads what decodes once: vLLM's engines for the engine
  methods, transformers' models for the peers and the log-likelihood pass.
- :mod:`semspec.benchmark.runner` — runs the methods interleaved prompt by prompt (same
  seeds and limits), plus transformers' assisted generation (``hf_assisted``) with the step
  draft; one raw record per (method, prompt).
- :mod:`semspec.benchmark.throughput` — ``--batch-size``: throughput by batch size on vLLM.
- :mod:`semspec.benchmark.metrics` — the figures, derived from the raw records.
- :mod:`semspec.benchmark.report` — ``results.json``, ``results.md`` and the PNG plots.

Raw counts are stored per run; every ratio is derived in ``metrics`` and defined in
``metrics.DEFINITIONS`` (which ``results.json`` carries along).
"""
