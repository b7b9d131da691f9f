"""Training the drafts (``semjobs draft``), once, on a workstation:

- ``train``: the layer draft, a cheap model for a target -- the target's first k layers plus
  trained adapter layers (self-speculation in the Kangaroo / LayerSkip manner: it shares the
  target's embedding, its first ``frozen_layers`` decoder layers and its tied LM head; on top
  sit ``adapter_layers`` decoder layers and a final norm, trained to match the target's
  next-token distribution); ``config`` and ``data`` feed it;
- ``head_build``, ``head_data``, ``head_train``: the draft head token_sd drafts with
  (``semspec.head``), on traces the target decodes on vLLM.

What they write is read where models load: the layer draft's artifact and its
materialisation in ``semspec.models.draft_artifact``, the embedded one in
``semspec.models.embedded_draft``.
"""
