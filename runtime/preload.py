"""Reading the model while the server starts: a GGUF file's header read and its quantized matrices
repacked for the CPU kernels on a thread, before torch is imported.

`tritium-server` starts a `Preload` right after parsing its arguments. Its main thread then spends
~1.3 s importing torch and the web stack (Python, holding the GIL); the repack is C with the GIL
released (`kernels.prepack_quantized`, one call per matrix), so it runs on the other core meanwhile
instead of after the imports. The loader then takes the result (`Preload.take`): the same mapping
and metadata (not parsed twice) and, per matrix, the panels `prepare_weights` would have made
(`QWeight.repacked`). Nothing here imports torch.

`matmul_groups` states which matrices the model prepares together (runtime/model.py: q/k/v,
gate/up, then the output projection, down projection and head alone); a group it names that the
model does not build is merely repacked for nothing (tests/test_preload.py checks that none is).
"""
from __future__ import annotations

import os
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass

import kernels
from runtime.gguf import GGUFFile, read_gguf
from runtime.tokenizer import load_tokenizer_in_background

# the matrices of one block that read the same input, in the model's order (runtime/model.py)
_BLOCK_GROUPS = (("attn_q", "attn_k", "attn_v"), ("attn_output",), ("ffn_gate", "ffn_up"), ("ffn_down",))


@dataclass
class Preloaded:
    gguf: GGUFFile  # read with map_data=True; its quantized pages already released where repacked
    packed: dict  # tensor name -> kernels.cpu.prepack.Packed
    seconds: float
    tokenizer: Future  # -> runtime.tokenizer.Tokenizer of the metadata, built on a thread of its own


def matmul_groups(gf: GGUFFile) -> list[list]:
    """The quantized 2-D matrices of `gf` as the model groups them (`kernels.PackMatrix` lists)."""
    by_name = {t.name: t for t in gf.tensors if len(t.shape) == 2}
    arch = gf.metadata.get("general.architecture")
    n_layer = int(gf.metadata.get(f"{arch}.block_count", 0) or 0)

    def matrix(name: str):
        t = by_name.get(name)
        return None if t is None else kernels.PackMatrix(name, int(t.qtype), int(t.shape[1]), int(t.shape[0]),
                                                         int(t.offset))

    names = [[f"blk.{i}.{n}.weight" for n in g] for i in range(n_layer) for g in _BLOCK_GROUPS]
    names.append(["output.weight" if "output.weight" in by_name else "token_embd.weight"])
    groups = [[matrix(n) for n in g] for g in names]
    return [g for g in groups if all(m is not None for m in g)]


def nvidia_present() -> bool:
    """Whether this machine shows an NVIDIA driver (then "auto" may pick CUDA: no CPU repack)."""
    return os.path.exists("/proc/driver/nvidia") or os.path.exists("/dev/nvidia0")


class Preload:
    """The read and repack of one GGUF file, running on its own thread from construction."""

    def __init__(self, path: str, n_threads: int = 1):
        self.path = path
        self._n_threads = n_threads
        self._result: Preloaded | None = None
        self._thread = threading.Thread(target=self._run, name="tritium-preload", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        t0 = time.perf_counter()
        try:
            gf = read_gguf(self.path, map_data=True)
            tokenizer = load_tokenizer_in_background(gf.metadata)
            packed = kernels.prepack_quantized(gf.data, matmul_groups(gf), self._n_threads, release_source=True)
        except Exception:  # noqa: BLE001 - the loader reads the file again and reports what is wrong
            return
        self._result = Preloaded(gf, packed, time.perf_counter() - t0, tokenizer)

    def take(self, path: str) -> Preloaded | None:
        """The result for `path` (waiting for it), once; None for another file or after a failure."""
        self._thread.join()
        result, self._result = self._result, None
        return result if os.path.abspath(path) == os.path.abspath(self.path) else None
