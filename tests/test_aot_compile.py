"""scripts/aot_compile.py: every Triton kernel compiles for sm_90 without a GPU (fake driver, the
wheel's ptxas), within the spill budget and the shared-memory limit; its variant collection
follows the dispatch layer (pruned configs, every kernel reached)."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
# every launchable kernel of kernels/triton (module-level `*_kernel` objects)
KERNELS = {f"{p.stem}.{m}" for p in (ROOT / "kernels" / "triton").glob("*.py")
           for m in re.findall(r"^def (_\w+_kernel)\(", p.read_text(), re.M)}

import aot_compile  # noqa: E402  (importing it changes nothing: the compiling runs in subprocesses)


def _session_cache(tmp_path: Path) -> Path:
    """The pytest session's base temporary folder / triton-sm90-cache (tmp_path is a child of it)."""
    return tmp_path.parent / "triton-sm90-cache"


def _script(*args, tmp_path, timeout=900):
    """scripts/aot_compile.py in a subprocess without TRITON_INTERPRET (the test suite runs
    under the interpreter; the compile check needs the real JIT). Triton's cache is the session's
    (shared with tests/test_gpu_model.py, which compiles many of the same variants)."""
    env = dict(os.environ, TRITON_CACHE_DIR=str(_session_cache(tmp_path)))
    env.pop("TRITON_INTERPRET", None)
    return subprocess.run([sys.executable, str(ROOT / "scripts" / "aot_compile.py"), *args],
                          capture_output=True, text=True, timeout=timeout, env=env)


def test_quick_compiles_every_kernel_for_sm90(tmp_path):
    """The CI run: zero failures, figures for every kernel."""
    out = tmp_path / "aot.json"
    p = _script("--quick", "--jobs", str(max(2, os.cpu_count() or 2)), "--json", str(out), tmp_path=tmp_path)
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-4000:]
    rows = json.loads(out.read_text())
    assert {r["kernel"] for r in rows} == KERNELS
    for r in rows:
        assert r["ok"] and r["arch"] == 90 and not r["problems"], r
        assert 0 < r["registers"] <= 255 and r["spill_stores"] == 0, r
        if r["kernel"].endswith("_paged_decode_kernel"):
            assert r["registers"] <= 128, r
        assert 0 <= r["smem"] <= aot_compile.SMEM_LIMIT[90], r
    mma = {r["mma"] for r in rows if r["kernel"].endswith("_qmm_tiled_kernel")}
    assert "wgmma" in mma, mma  # Hopper tensor-core path for the prefill matmul
    assert "| sm_90 | `_qmm_tiled_kernel` |" in p.stdout  # the table


def test_collection_follows_the_dispatch_layer(tmp_path):
    out = tmp_path / "variants.json"
    p = _script("--quick", "--list", "--json", str(out), tmp_path=tmp_path)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    variants = json.loads(out.read_text())
    assert {v["kernel"] for v in variants} == KERNELS
    gemv = [v["kwargs"] for v in variants if v["kernel"].endswith("_qmm_gemv_kernel")]
    for kw in gemv:  # the pruning rule of qmatmul_gemv holds for every collected config
        assert kw["BLOCK_M"] * kw["BLOCK_N"] * kw["BLOCK_K"] <= 128 * 32 * kw["num_warps"], kw
    assert {kw["BLOCK_M"] for kw in gemv} == {1, 16}
    assert len(gemv) == 6 + 2  # configs left after pruning at 1 and at 16 rows
    tiled = {(v["kwargs"]["BLOCK_M"], v["kwargs"]["BLOCK_N"], v["kwargs"]["BLOCK_K"])
             for v in variants if v["kernel"].endswith("_qmm_tiled_kernel")}
    assert len(tiled) == 5 and (64, 64, 64) in tiled and (128, 128, 32) in tiled
    assert (32, 64, 128) not in tiled  # the spilling config is gone
    decode = [v["kwargs"] for v in variants if v["kernel"].endswith("_paged_decode_kernel")]
    # the GQA groups of llama3-8b / gemma (4 heads) padded to one 16-row tl.dot tile (<= 128 registers)
    assert {kw["BLOCK_G"] for kw in decode} == {16} and all(kw["num_warps"] in (4, 8) for kw in decode)
    q8 = [v["kwargs"] for v in variants if v["kernel"].endswith("_qmm_q8_gemv_kernel")]
    assert {kw["BLOCK_M"] for kw in q8} == {1, 8} and all(kw["ASM"] for kw in q8)  # dp4a, decode rows
    assert any(kw["SOFTCAP"] for kw in decode)
    full = _script("--list", "--shape", "qwen3-235b-attn", "--act", "bfloat16", "--only", "attention",
                   tmp_path=tmp_path)
    assert "BLOCK_G=16" in full.stdout  # 16 heads per KV head: the tl.dot path is compiled too


def test_check_flags_spills_and_shared_memory():
    r = aot_compile.Result("k", "v", 90, True, registers=200, spill_stores=8, smem=300 * 1024)
    aot_compile.check(r, spill_budget=0)
    assert len(r.problems) == 2
    r = aot_compile.Result("paged_decode._paged_decode_kernel", "v", 90, True, registers=129, spill_stores=0, smem=0)
    aot_compile.check(r, spill_budget=0)
    assert r.problems == ["129 registers > 128"]  # decode attention: two blocks per SM and more
    r = aot_compile.Result("k", "v", 80, True, registers=64, spill_stores=8, smem=100 * 1024)
    aot_compile.check(r, spill_budget=64)
    assert r.problems == []
    r = aot_compile.Result("k", "v", 80, False, error="CompilationError: boom")
    aot_compile.check(r, 0)
    assert r.problems == ["compile error"]


def test_ptxas_log_parsing():
    log = ("ptxas info    : Function properties for k\n"
           "    0 bytes stack frame, 12 bytes spill stores, 16 bytes spill loads\n"
           "ptxas info    : Used 168 registers, used 1 barriers, 512 bytes cmem[0]\n")
    assert aot_compile._ptxas_usage(log) == (168, 12, 16)
    assert aot_compile._ptxas_usage("nothing") is None
