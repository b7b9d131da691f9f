"""SemanticSpec decoding engine: pure torch + transformers, no service code inside.

Public API (imported from the submodules, so that ``import semspec.types`` stays light):

- ``semspec.engine.Engine`` — ``Engine.load(target, draft, probes, device, cache_dir, dtype,
  batch_size)``, ``engine.generate(messages_or_prompt, GenerationConfig) -> GenerationResult``,
  ``engine.generate_many(prompts, config, batch_size)`` (continuous batching, yields
  ``Finished`` as prompts end), ``engine.identities``.
- ``semspec.runner`` — ``ModelRunner``: one forward pass over a ragged batch, slot-owned KV.
- ``semspec.scheduler`` — ``Scheduler``: every active sequence's passes, once per model per tick.
- ``semspec.types`` — ``GenerationConfig``, ``GenerationResult``, ``StepRecord``, ``Counters``,
  ``Request``, ``Finished``.
- ``semspec.models`` — ``load_model(spec, device, cache_dir)`` for local HF directories, GGUF
  files and ``embedded:<name>`` models; ``encode_prompt`` / ``render_prompt`` (chat template);
  ``truncated_copy``; ``register_embedded``.
- ``semspec.probes`` — ``Probe`` (MLP + sigmoid, safetensors + JSON metadata), ``ProbePair``,
  ``step_features`` (the pooled states the engine computes), ``train_probe``.
- ``semspec.steps`` — ``StepDetector``, ``split_steps``.
- ``semspec.answers`` — ``final_answer`` / ``extract_answer`` (a text's final answer),
  ``split_reasoning``, ``reference_from``, ``is_correct`` (math-verify, numeric fallback).
- ``semspec.benchmark`` — every method side by side, quality beside speed (``semjobs bench``).
"""
