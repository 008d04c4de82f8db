"""scripts/gpu_model.py, the static performance model of the CUDA path: its SASS reading and
occupancy arithmetic on known inputs, and the targets of kernels/README.md ("Static performance
model") on the kernels as they compile here for sm_90 (no GPU): decode attention within 128
registers and no spills, the dp4a decode GEMV's loads and instructions per weight, the predicted
single-stream decode of Llama-3-8B Q4_K_M against the H100's bandwidth bound. CI runs the same
script under triton 3.6.0 (the GPU machine's version, .ci/run)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import gpu_model  # noqa: E402  (importing it compiles nothing)
import sass_stats  # noqa: E402

SASS = """
        /*0000*/                   S2R R0, SR_CTAID.X ;
        /*0010*/                   LDG.E.U16 R2, desc[UR6][R4.64] ;
.L_x_1:
        /*0020*/                   LDG.E.128 R8, desc[UR6][R6.64] ;
        /*0030*/                   LDG.E.64 R12, desc[UR6][R14.64] ;
        /*0040*/                   IDP.4A.S8.S8 R16, R8, R12, R16 ;
        /*0050*/                   LOP3.LUT R9, R9, 0xf0f0f0f, RZ, 0xc0, !PT ;
        /*0060*/                   HMMA.16816.F32.BF16 R20, R24, R28, R20 ;
        /*0070*/               @P0 BRA `(.L_x_1) ;
        /*0080*/                   STG.E desc[UR6][R2.64], R16 ;
        /*0090*/                   EXIT ;
.L_x_2:
        /*00a0*/                   BRA `(.L_x_2);
        /*00b0*/                   NOP;
"""


def test_sass_main_loop_counts():
    s = sass_stats.analyze(SASS)
    assert s.n_loops == 1  # the trailing BRA-to-self is no loop
    lo = s.loop
    assert (lo.instructions, lo.ldg, lo.ldg_bytes, lo.dp4a, lo.mma) == (6, 2, 24, 1, 1)
    assert dict(lo.ldg_widths) == {16: 1, 8: 1}
    assert (s.outside.instructions, s.outside.ldg_bytes) == (5, 2)  # NOPs not counted


def test_occupancy_from_registers_and_shared_memory():
    g = gpu_model.GPUS["H100"]

    def c(regs, warps, smem=0):
        return sass_stats.Compiled("k", 90, regs, 0, 0, smem, warps, "-", sass_stats.analyze(""))

    assert gpu_model.occupancy(c(128, 4), g) == 4  # 65536 / (128 x 128)
    assert gpu_model.occupancy(c(129, 4), g) == 3  # allocated per warp in units of 256 registers
    assert gpu_model.occupancy(c(32, 4), g) == 16  # then threads: 2048 / 128
    assert gpu_model.occupancy(c(64, 4, smem=100 * 1024), g) == 2  # then shared memory
    assert gpu_model.occupancy(c(255, 8), g) == 1


def test_static_model_targets(tmp_path):
    """The CI run: the model traced through the real decoder on the meta device, its kernels
    compiled for sm_90; `--check` holds (kernels/README.md)."""
    out = tmp_path / "model.json"
    # the session's triton cache, shared with tests/test_aot_compile.py (many of the same variants)
    env = dict(os.environ, TRITON_CACHE_DIR=str(tmp_path.parent / "triton-sm90-cache"))
    env.pop("TRITON_INTERPRET", None)
    p = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_model.py"), "--ci", "--check", "--jobs",
                        str(max(2, os.cpu_count() or 2)), "--json", str(out)],
                       capture_output=True, text=True, timeout=1500, env=env)
    assert p.returncode == 0, p.stdout[-5000:] + p.stderr[-3000:]
    r = json.loads(out.read_text())
    assert "| decode 1 stream, ctx 256 | H100 |" in p.stdout and "Decode GEMV designs" in p.stdout
    att = r["attention_decode"]
    assert len(att) >= 4 and all(0 < a["registers"] <= 128 and a["spill_stores"] == 0 for a in att), att
    assert all(a["blocks_per_sm"] >= 2 for a in att)
    dec = r["scenarios"]["decode 1 stream, ctx 256"]["H100"]
    assert dec["fraction"] >= gpu_model.DECODE_FLOOR, dec["fraction"]
    assert 400e6 < dec["bytes"] - r["weights_bytes"] + 4.2e9 < 4.9e9  # ~4.7 GB of weights per token
    # the decode GEMV: 16-byte code loads, a few instructions per weight, well under the FMA design's
    gemv = [k for k in r["kernels"] if k["kernel"] == "_qmm_q8_gemv_kernel"]
    assert gemv and all(k["per_weight"]["ldg_per_weight"] < 0.35 and k["per_weight"]["instr_per_weight"] < 3.5
                        and 16 in {int(w) for w in k["per_weight"]["ldg_widths"]} for k in gemv), gemv
    dots = {(d["design"], d["type"], d["tile"]): d for d in r["dot_products"]}
    for (design, qt, tile), d in dots.items():
        if design == "dp4a":
            fma = dots[("fma", qt, tile)]
            assert d["instr_per_weight"] * 3 < fma["instr_per_weight"], (d, fma)
