"""What a worker decodes with: vLLM's engines, driven by semspec.

- ``token_engine``: ``VLLMEngine``, one engine for ``ar`` and ``token_sd`` (vLLM's own
  speculative decoding, configured by ``speculation``; the draft head's architecture in
  ``head_plugin`` and ``head_model``), and the start-up every engine shares;
- ``step_engine``: ``VLLMStepEngine``, a target and a draft engine for the step-level methods
  (``semspec.stepwise``), each step's probe states out of vLLM's KV cache (``states``); a
  draft with a reduced vocabulary runs its LM head over that vocabulary only
  (``reduced_vocab_plugin``, ``reduced_vocab_model``).
"""
