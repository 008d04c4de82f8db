"""Reading the model while the server starts: a GGUF file's header read and its quantized matrices
repacked for the CPU kernels on a thread, before torch is imported.

`tritium-server` starts a `Preload` right after parsing its arguments. Its main thread then spends
~1.3 s importing torch and the web stack (Python, holding the GIL); the repack is C with the GIL
released (`kernels.prepack_quantized`, one call for all matrices), so it runs on the other core
meanwhile instead of after the imports. The loader then takes the result (`Preload.take`): the same
mapping and metadata (not parsed twice) and, per matrix, the panels `prepare_weights` would have
made (`QWeight.repacked`). Nothing here imports torch.

The header's big arrays and the tokenizer (~0.5 s of Python for a 150k vocabulary) are computed in
a forked child process (`_Forked`, on Linux when the process has no other thread yet): Python
threads would take turns on the GIL with the imports, and that slowed them by 0.6-0.8 s (more than
the tokenizer's own time). The child sends the header without those arrays (`light_header`), then
the tokenizer without its `tokenizers` encoder (pickled data); the server unpickles it and builds
the encoder (`Tokenizer.build_encoder`, ~0.15 s). If the child fails, the file is read here as
before.

`matmul_groups` states which matrices the model prepares together (runtime/model/decoder.py: q/k/v,
gate/up, then the output projection, down projection and head alone); a group it names that the
model does not build is merely repacked for nothing (tests/test_preload.py checks that none is).
"""
from __future__ import annotations

import ctypes
import os
import pickle
import signal
import sys
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import kernels
from runtime.model.gguf import GGUFFile, light_header, map_file, read_gguf
from runtime.tokenizer import Tokenizer, load_tokenizer, load_tokenizer_in_background, tokenizer_from_gguf_metadata

# the matrices of one block that read the same input, in the model's order (runtime/model/decoder.py)
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


def fork_usable() -> bool:
    """Whether a start-up may fork its reading child: Linux, and no thread but this one (a fork
    copies no other thread, and a lock one held would stay locked in the child)."""
    return sys.platform.startswith("linux") and hasattr(os, "fork") and threading.active_count() == 1


class _Forked:
    """A child process that reads a GGUF file's header and builds its tokenizer, sending both
    back as pickles: each written to a memory file shared with the child, then announced on a pipe
    by its (offset, length). The pickle itself is read in one call: read from the pipe in 64 KiB
    pieces, each piece would take the GIL back from the imports (~160 turns for a Qwen2 vocab)."""

    def __init__(self, path: str):
        """Raises OSError where a memory file, a pipe or a fork cannot be had (nothing left open)."""
        parent = os.getpid()
        self._mem = os.memfd_create("tritium-preload", os.MFD_CLOEXEC)
        try:
            r, w = os.pipe()
        except OSError:
            os.close(self._mem)
            raise
        try:
            self.pid = os.fork()
        except OSError:
            for fd in (self._mem, r, w):
                os.close(fd)
            raise
        if self.pid == 0:  # the child: never returns
            os.close(r)
            _child(path, w, self._mem, parent)
        os.close(w)
        self._pipe = r

    def receive(self):
        """The next object sent, or None when the child stopped before sending it."""
        try:
            rec = os.read(self._pipe, 16)
            if len(rec) != 16:
                return None
            off, n = int.from_bytes(rec[:8], "little"), int.from_bytes(rec[8:], "little")
            data = os.pread(self._mem, n, off)
            return pickle.loads(data) if len(data) == n else None
        except (OSError, ValueError, pickle.UnpicklingError, EOFError):
            return None

    def close(self) -> None:
        for fd in (self._pipe, self._mem):
            os.close(fd)
        try:
            os.waitpid(self.pid, 0)
        except ChildProcessError:
            pass


def _child(path: str, pipe: int, mem: int, parent: int) -> None:
    code = 1
    try:
        # ends with the server: a start-up killed now leaves no child reading on (Linux prctl
        # PR_SET_PDEATHSIG; a parent gone before it was set is seen by getppid)
        try:
            ctypes.CDLL(None).prctl(1, signal.SIGKILL)
        except (OSError, AttributeError):  # no prctl: the child ends at its next write instead
            pass
        if os.getppid() != parent:
            return
        os.nice(19)  # the server's imports come first on a busy core
        gf = read_gguf(path)
        off = 0

        def send(obj) -> None:
            nonlocal off
            data = pickle.dumps(obj, protocol=5)
            os.pwrite(mem, data, off)
            os.write(pipe, off.to_bytes(8, "little") + len(data).to_bytes(8, "little"))
            off += len(data)

        send(light_header(gf, path))
        send(tokenizer_from_gguf_metadata(gf.metadata, build_encoder=False))
        code = 0
    except BaseException:  # noqa: BLE001 - the server reads the file itself and reports what is wrong
        pass
    finally:
        os._exit(code)


def _tokenizer_of(forked: _Forked, path: str) -> Future:
    """The child's tokenizer with its encoder built, on a thread; built here from the file if the
    child sent none."""
    def run() -> Tokenizer:
        try:
            tok = forked.receive()
        finally:
            forked.close()
        if isinstance(tok, Tokenizer):
            return tok.build_encoder()
        return load_tokenizer(path)

    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tritium-tokenizer")
    future = pool.submit(run)
    pool.shutdown(wait=False)
    return future


class Preload:
    """The read and repack of one GGUF file, running on its own thread from construction.
    `fork`: read the header and build the tokenizer in a child process (default: `fork_usable()`)."""

    def __init__(self, path: str, n_threads: int = 1, fork: bool | None = None):
        self.path = path
        self._n_threads = n_threads
        self._result: Preloaded | None = None
        self._forked = None
        if fork_usable() if fork is None else fork:
            try:
                self._forked = _Forked(path)
            except (OSError, AttributeError):  # no memfd_create (old kernel), no fork: read here
                pass
        self._thread = threading.Thread(target=self._run, name="tritium-preload", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        t0 = time.perf_counter()
        forked, self._forked = self._forked, None
        try:
            header = forked.receive() if forked is not None else None
            if isinstance(header, GGUFFile):
                gf = map_file(header, self.path)
                tokenizer, forked = _tokenizer_of(forked, self.path), None  # the future closes it
            else:
                gf = read_gguf(self.path, map_data=True)
                tokenizer = load_tokenizer_in_background(gf.metadata)
            packed = kernels.prepack_quantized(gf.data, matmul_groups(gf), self._n_threads, release_source=True)
        except Exception:  # noqa: BLE001 - the loader reads the file again and reports what is wrong
            return
        finally:
            if forked is not None:
                forked.close()
        self._result = Preloaded(gf, packed, time.perf_counter() - t0, tokenizer)

    def take(self, path: str) -> Preloaded | None:
        """The result for `path` (waiting for it), once; None for another file or after a failure."""
        self._thread.join()
        result, self._result = self._result, None
        return result if os.path.abspath(path) == os.path.abspath(self.path) else None
