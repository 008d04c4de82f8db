"""The model room: what a model is and how it computes, with no serving state.

- `gguf.py` the GGUF reader; `loader.py` a GGUF file or (`safetensors_loader.py`) a Hugging Face
  folder -> `LoadedModel`; `lora.py` adapters; `tiny_model.py` generated test models;
  `model_files.py` the real models CI fetches.
- `decoder.py` the forward of every supported architecture over the paged KV cache it is handed;
  `arch/` the architectures that differ from llama's block; `cuda_graphs.py` decode replay.
"""
