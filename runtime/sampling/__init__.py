"""llama.cpp's sampler chain: `samplers.py` the samplers on a candidate set, `sampler.py` the
chain over a batch of logit rows with each row's parameters and state."""
