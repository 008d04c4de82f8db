"""Model loading, tokenizer, chat templates, forward, paged KV cache, scheduler, sampler, caches."""
import os

# The CPU path alternates torch ops (OpenMP pool) with numpy BLAS calls (OpenBLAS pool) on the same
# cores. OpenMP workers that spin while idle steal the cores from the BLAS threads and make a decode
# step about twice as slow; passive waiting avoids that. Must be set before torch is imported.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
