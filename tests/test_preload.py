"""runtime/launch/preload.py + kernels/cpu/prepack.py: the server's start-up read of a GGUF file, its
quantized matrices repacked on a thread before torch is imported, gives the model exactly the
weights (and logits) of the ordinary load, and covers exactly the matrices the model packs."""
from __future__ import annotations

import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

import kernels
from kernels.cpu import native, qdot
from runtime.model.loader import load_model
from runtime.model.decoder import Model, SeqBatch
from runtime.launch.preload import Preload, matmul_groups
from runtime.tokenizer import load_tokenizer
from runtime.model.tiny_model import GEMMA3_SPEC, TinyModelSpec, write_tiny_model

pytestmark = pytest.mark.skipif(native.lib() is None or not qdot.available(),
                                reason="the repack needs the compiled CPU kernels")

ROOT = Path(__file__).resolve().parents[1]

SPECS = {  # tied head (qwen2), untied quantized head (llama), mixed types and a gemma3 layout
    "qwen2-q4_k-tied": TinyModelSpec(arch="qwen2", n_layer=2, n_embd=256, n_head=4, n_head_kv=2, n_ff=512,
                                     wtype="q4_k", seed=11, norm_std=0.1, n_vocab=300, tie_embeddings=True),
    "llama-q6_k": TinyModelSpec(arch="llama", n_layer=2, n_embd=256, n_head=4, n_head_kv=4, n_ff=512,
                                wtype="q6_k", seed=12),
    "gemma3-q8_0": replace(GEMMA3_SPEC, wtype="q8_0", n_vocab=300, norm_std=0.1),
}


def _x8(m: Model) -> list:
    ws = [w for L in m.layers for w in (*L.wqkv, L.wo, *L.w_gate_up, L.w_down)] + [m.output]
    return [w for w in ws if w.layout == "x8"]


def _logits(m: Model, ids: list[int]) -> torch.Tensor:
    from runtime.model.kv_store import SeqKV
    from runtime.serving.blocks import BlockManager
    kv = BlockManager(m.new_kv_store(64))
    seq = SeqKV()
    kv.reserve(seq, len(ids))
    return m.forward(kv.store, [SeqBatch(seq, ids, 0)])[0]


@pytest.mark.parametrize("fork", [True, False], ids=["forked", "threads"])
@pytest.mark.parametrize("key", sorted(SPECS))
def test_preloaded_model_is_the_ordinary_model(tmp_path, key, fork):
    path = tmp_path / f"{key}.gguf"
    write_tiny_model(path, SPECS[key], vocab="builtin" if key.startswith("llama") else None)
    pre = Preload(str(path), fork=fork).take(str(path))
    assert pre is not None and pre.packed
    fast = Model(load_model(path, preloaded=pre), "cpu")
    slow = Model(load_model(path), "cpu")
    xs_fast, xs_slow = _x8(fast), _x8(slow)
    assert len(xs_fast) == len(xs_slow) > 0
    for a, b in zip(xs_fast, xs_slow):  # same panels, bit for bit
        assert a.rows == b.rows and torch.equal(a.data, b.data)
    # every x8 weight of the preloaded model is a prepack buffer, and every prepack buffer is used
    bufs = {id(p.buf): p.buf for p in pre.packed.values()}
    used = {w.data.data_ptr() for w in xs_fast}
    assert used == {b.ctypes.data for b in bufs.values()}
    assert sum(len(g) for g in matmul_groups(pre.gguf)) == len(pre.packed)
    ids = [1, 5, 9, 200, 3, 7]
    assert torch.equal(_logits(fast, ids), _logits(slow, ids))
    try:  # the tokenizer built beside the repack: what the ordinary load builds (or its error)
        want = load_tokenizer(path).n_vocab
    except ValueError as e:
        with pytest.raises(ValueError, match=str(e)):
            pre.tokenizer.result()
    else:
        assert pre.tokenizer.result().n_vocab == want


SHARED_VOCAB = ROOT.parent / "shared" / "vocab"


@pytest.mark.parametrize("name", ["qwen2", "llama-spm"])
def test_the_forked_read_gives_the_header_and_tokenizer_of_the_file(name):
    """The child process's header (its big arrays left unread, their lengths known) and tokenizer
    (encoder built here) are the file's: same metadata, same tokens for llama.cpp's vectors."""
    path = SHARED_VOCAB / f"ggml-vocab-{name}.gguf"
    if not path.exists():
        pytest.skip(f"{path} not available")
    from runtime.model.gguf import UnreadArray, read_gguf

    pre = Preload(str(path), fork=True).take(str(path))
    want = read_gguf(path)
    md = pre.gguf.metadata
    assert set(md) == set(want.metadata) and pre.gguf.data is not None
    unread = {k for k, v in md.items() if isinstance(v, UnreadArray)}
    assert "tokenizer.ggml.tokens" in unread and "tokenizer.ggml.token_type" in unread
    for k, v in md.items():
        assert len(v) == len(want.metadata[k]) if k in unread else v == want.metadata[k]
    assert md["tokenizer.ggml.tokens"][7] == want.metadata["tokenizer.ggml.tokens"][7]  # read on use
    tok, ref = pre.tokenizer.result(), load_tokenizer(path)
    texts = Path(str(path) + ".inp").read_text(encoding="utf-8").split("\n__ggml_vocab_test__\n")
    assert len(texts) > 40
    assert [tok.encode(t) for t in texts] == [ref.encode(t) for t in texts]
    assert tok.token_pieces() == ref.token_pieces()


def test_a_failing_child_leaves_the_read_to_the_server(tmp_path, monkeypatch):
    """A child that fails before its header (or before its tokenizer) sends nothing more: the
    server reads the file (or builds the tokenizer) itself, with the same result."""
    from runtime.launch import preload as preload_mod

    path = tmp_path / "m.gguf"
    write_tiny_model(path, SPECS["qwen2-q4_k-tied"], vocab="builtin")
    want = load_tokenizer(path)

    def fail(*a, **k):
        raise RuntimeError("child failure")

    for name in ("tokenizer_from_gguf_metadata", "light_header"):  # the child runs the patched copy
        with monkeypatch.context() as m:
            m.setattr(preload_mod, name, fail)
            pre = Preload(str(path), fork=True).take(str(path))
        assert pre is not None and pre.packed
        tok = pre.tokenizer.result()
        assert tok.encode("hello world") == want.encode("hello world") and tok.n_vocab == want.n_vocab
        assert pre.gguf.metadata["tokenizer.ggml.tokens"][:5] == ["!", '"', "#", "$", "%"]


@pytest.mark.parametrize("missing", ["memfd_create", "fork"])
def test_no_child_where_the_system_gives_none(tmp_path, monkeypatch, missing):
    """No memory file (an old kernel) or no fork (EAGAIN): the read runs in the server, nothing is
    left open."""
    import gc
    import os

    if not os.path.isdir("/proc/self/fd"):
        pytest.skip("counts this process's descriptors in /proc (Linux, where the child is forked)")
    path = tmp_path / "m.gguf"
    write_tiny_model(path, SPECS["qwen2-q4_k-tied"], vocab="builtin")
    load_tokenizer(path)

    def refuse(*a, **k):
        raise OSError(11, "refused")

    def open_fds() -> list[str]:  # what this process's descriptors point at
        out = []
        for fd in os.listdir("/proc/self/fd"):
            try:
                out.append(os.readlink(f"/proc/self/fd/{fd}"))
            except OSError:
                pass
        return out

    before = open_fds()
    with monkeypatch.context() as m:
        m.setattr(os, missing, refuse)
        p = Preload(str(path), fork=True)
        assert p._forked is None
        pre = p.take(str(path))
    assert pre is not None and pre.packed and pre.tokenizer.result().encode("hi") == load_tokenizer(path).encode("hi")
    del p, pre  # the mapping holds a descriptor of the file
    gc.collect()
    after = open_fds()
    assert not [f for f in after if "tritium-preload" in f]  # the memory file
    assert sum(f.startswith("pipe:") for f in after) <= sum(f.startswith("pipe:") for f in before)


def test_the_child_ends_with_the_server(tmp_path):
    """A start-up killed while its child still reads (here: the server process exits at once)
    leaves no child behind: it dies with its parent."""
    path = SHARED_VOCAB / "ggml-vocab-qwen2.gguf"  # ~0.5 s of tokenizer work for the child
    if not path.exists():
        pytest.skip(f"{path} not available")
    if not Path("/proc/self/task").is_dir():
        pytest.skip("finds the child in /proc (Linux, where the child is forked)")
    out = tmp_path / "child"
    code = ("import os, sys; from runtime.launch.preload import Preload; p = Preload(sys.argv[1], fork=True); "
            "open(sys.argv[2], 'w').write(open(f'/proc/self/task/{os.getpid()}/children').read()); os._exit(0)")
    # no pipe shared with the child: run() returns when the parent has exited
    subprocess.run([sys.executable, "-c", code, str(path), str(out)], cwd=ROOT, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL, timeout=60, check=True)
    pid = int(out.read_text().split()[0])

    def alive() -> bool:  # a zombie (not yet reaped by init) counts as gone
        try:
            return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
        except OSError:
            return False

    deadline = time.monotonic() + 0.05  # the child's own work lasts ~0.5 s
    while alive() and time.monotonic() < deadline:
        time.sleep(0.005)
    assert not alive()


def test_take_is_once_and_for_its_own_file(tmp_path):
    path = tmp_path / "m.gguf"
    write_tiny_model(path, SPECS["qwen2-q4_k-tied"])
    p = Preload(str(path))
    assert p.take(str(tmp_path / "other.gguf")) is None  # another file: not used (and dropped)
    p = Preload(str(path))
    assert p.take(str(path)) is not None
    assert p.take(str(path)) is None


def test_a_bad_file_leaves_the_error_to_the_loader(tmp_path):
    path = tmp_path / "bad.gguf"
    path.write_bytes(b"GGUF" + b"\x00" * 12)
    assert Preload(str(path)).take(str(path)) is None
    with pytest.raises(ValueError):
        load_model(path)


def test_prepack_takes_whole_groups_only(tmp_path):
    path = tmp_path / "m.gguf"
    write_tiny_model(path, SPECS["qwen2-q4_k-tied"])
    pre = Preload(str(path)).take(str(path))
    gf = pre.gguf
    groups = matmul_groups(gf)
    q, k = groups[0][0], groups[0][1]
    f32 = kernels.PackMatrix("f32", 0, 4, 256, 0)  # GGML type 0 (F32): not a qdot type
    narrow = replace(k, name="narrow", cols=128, rows=k.rows * 2)  # a different width than q
    out = kernels.prepack_quantized(np.asarray(gf.data), [[q, f32], [q, narrow], [replace(k, name="alone")]])
    assert set(out) == {"alone"}
    assert out["alone"].nbytes == qdot.repacked_bytes(k.qtype, k.rows, k.cols)
    with pytest.raises(ValueError, match="outside"):
        kernels.prepack_quantized(np.asarray(gf.data), [[replace(k, offset=gf.data.nbytes)]])


def test_the_cli_and_the_preload_import_no_torch():
    code = ("import sys, api.cli, runtime.launch.preload, kernels.cpu.prepack; "
            "assert 'torch' not in sys.modules and 'fastapi' not in sys.modules, 'imported'")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_the_cli_preloads_only_a_cpu_model_of_one_process(tmp_path, monkeypatch):
    from api.cli import build_parser, start_preload
    from runtime.launch import preload as preload_mod

    path = tmp_path / "m.gguf"
    write_tiny_model(path, SPECS["qwen2-q4_k-tied"])
    monkeypatch.setattr(preload_mod, "nvidia_present", lambda: False)

    def started(*argv):
        p = start_preload(build_parser().parse_args(list(argv)))
        if p is not None:
            assert p.take(str(path)) is not None
        return p is not None

    assert started("-m", str(path))
    assert started("-m", str(path), "--device", "cpu")
    assert not started("-m", str(path), "--device", "cuda")
    assert not started("-m", str(path), "-tp", "2")
    assert not started("-m", str(tmp_path / "missing.gguf"))
    assert not started()
    monkeypatch.setattr(preload_mod, "nvidia_present", lambda: True)
    assert not started("-m", str(path))  # "auto" may choose CUDA there
    assert started("-m", str(path), "--device", "cpu")
