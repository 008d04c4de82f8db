"""Model loading, tokenizer, chat templates, forward, paged KV cache, scheduler, sampler, caches."""
