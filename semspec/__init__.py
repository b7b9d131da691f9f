"""SemanticSpec decoding engine: pure torch + transformers, no service code inside.

Public API (imported from the submodules, so that ``import semspec.types`` stays light):

- ``semspec.engine.Engine`` — ``Engine.load(target, draft, probes, device, cache_dir)``,
  ``engine.generate(messages_or_prompt, GenerationConfig) -> GenerationResult``,
  ``engine.identities``, ``engine.new_sequence(...)`` (per-sequence state, ``advance()``).
- ``semspec.types`` — ``GenerationConfig``, ``GenerationResult``, ``StepRecord``, ``Counters``.
- ``semspec.models`` — ``load_model(spec, device, cache_dir)`` for local HF directories, GGUF
  files and ``embedded:<name>`` models; ``encode_prompt`` / ``render_prompt`` (chat template);
  ``truncated_copy``; ``register_embedded``.
- ``semspec.probes`` — ``Probe`` (MLP + sigmoid, safetensors + JSON metadata), ``ProbePair``,
  ``step_features`` (the pooled states the engine computes), ``train_probe``.
- ``semspec.steps`` — ``StepDetector``, ``split_steps``, ``extract_answer``.
- ``semspec.benchmark`` — every method side by side, quality beside speed (``semjobs bench``).
"""
