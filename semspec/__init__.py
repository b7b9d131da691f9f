"""SemanticSpec decoding on vLLM: the semantic layer (steps, probes, acceptance) over vLLM's
engines, no service code inside.

Public API (imported from the submodules, so that ``import semspec.types`` stays light):

- ``semspec.engine.token_engine`` — ``VLLMEngine.load(target, draft, device, cache_dir, dtype,
  batch_size, kv_cache_gb, speculative_tokens)``: ``ar``, and ``token_sd`` with vLLM's own
  speculation (``semspec.engine.speculation``; the draft head exported by
  ``semspec.engine.head_plugin``);
  ``engine.generate(prompt, GenerationConfig) -> GenerationResult``,
  ``engine.generate_many(prompts, config, batch_size)`` (continuous batching, yields
  ``Finished`` as prompts end), ``engine.identities``.
- ``semspec.engine.step_engine`` — ``VLLMStepEngine.load(target, draft, probes, ...)``: the
  step-level methods (``semspec.stepwise``: ``ar``, ``semspec``, ``step_judge``) on a target
  and a draft engine, the probes' states out of vLLM's KV cache (``semspec.engine.states``).
- ``semspec.engine.vllm_cpu_fixes`` / ``vllm_cpu_sampling`` / ``vllm_cpu_speculation`` /
  ``vllm_cpu_verification`` — sampling and speculation on vLLM's CPU build: two bugs
  corrected, sampling by inversion, steps that draft nothing without speculation's costs, and
  drafted tokens verified by the target's own draws, in the engine's process (``start_engine``,
  and vLLM's plugin entry points).
- ``semspec.types`` — ``GenerationConfig``, ``GenerationResult``, ``StepRecord``, ``Counters``,
  ``Request``, ``Finished``.
- ``semspec.components`` / ``semspec.prompts`` — the embedded pair's defaults and what each
  method needs; a prompt rendered through its chat template (``render_prompt``,
  ``encode_prompt``), its token ids, step_judge's question.
- ``semspec.models`` — model specs (``specs``: ``embedded:<name>``, GGUF files, local HF
  directories, hub names ``org/name[@revision]`` through the Hugging Face cache (``hub``);
  ``model_directory``, what vLLM loads; ``register_embedded``), identities
  (``identity``), and ``loaded.load_model(spec, device, cache_dir)`` for transformers
  (training, calibration, quality passes; ``truncated_copy``).
- ``semspec.probes`` — ``Probe`` (MLP + sigmoid, safetensors + JSON metadata), ``ProbePair``,
  ``step_features`` (pooled states over a step), ``train_probe``.
- ``semspec.steps`` — ``StepDetector``, ``split_steps``.
- ``semspec.answers`` — ``final_answer`` / ``extract_answer`` (a text's final answer),
  ``split_reasoning``, ``reference_from``, ``is_correct`` (math-verify, numeric fallback).

What builds artifacts once, apart from what a worker runs:

- ``semspec.calibration`` — probe calibration: ``collect`` samples on the pair, ``labels``
  judges meaning, ``train`` fits the probes (``semjobs probe``).
- ``semspec.draft`` — the layer draft's and the draft head's training (``semjobs draft``).
- ``semspec.benchmark`` — every method side by side, quality beside speed (``semjobs bench``).
"""
