"""The embedded draft for SmolLM2-135M-Instruct: ``draft.json`` + ``draft.safetensors``
(built with ``semjobs draft train``; see ``semspec.draft``)."""
