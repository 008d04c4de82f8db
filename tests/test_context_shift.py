"""--context-shift: llama-server's n_discard shift of a generating slot that fills its context.

The shift itself (BlockManager.shift over KVStore.move) on the CPU kernels, in Triton (the
interpreter on CPU tensors; TRITON_INTERPRET=1 is set here before triton is imported) and in the
torch reference: the kept keys re-rotated as if computed at their new positions; and the served
tokens against llama-server b1-0c1e570's on the built-in tiny model, recorded by
`python scripts/record_ctx_shift_reference.py --server /work/lsb/llama-server`
(tests/data/avx2/ctx_shift_reference.json: -c 256 -np 1 --context-shift)."""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import dataclasses  # noqa: E402
import hashlib  # noqa: E402
import json  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

import kernels  # noqa: E402
from kernels import ref  # noqa: E402
from runtime.model.decoder import Model, SeqBatch  # noqa: E402
from runtime.model.kv_store import KVStore, SeqKV  # noqa: E402
from runtime.model.loader import load_model  # noqa: E402
from runtime.model.tiny_model import BUILTIN_SPEC, write_tiny_model  # noqa: E402
from runtime.serving.blocks import BlockManager  # noqa: E402
from tests.llama_tokens import float_order  # noqa: E402

REFERENCE = Path(__file__).parent / "data" / "avx2" / "ctx_shift_reference.json"


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("ctxshift") / "builtin.gguf", BUILTIN_SPEC, vocab="builtin")


@pytest.fixture(scope="module")
def tiny(tiny_path) -> Model:
    return Model(load_model(tiny_path, progress=lambda m: None), "cpu")


def _store(m: Model, backend: str) -> KVStore:
    rot = dataclasses.replace(m.key_rotation(), ops=kernels.Backend.for_device("cpu", backend))
    return KVStore(len(m.layers), m.n_head_kv, m.head_dim, 8, 16, torch.float16, "cpu", rope=rot)


@pytest.mark.parametrize("backend", ["cpu", "triton", "torch"])
def test_shift_moves_and_rerotates_the_kept_keys(tiny, backend):
    """After a shift of 12 tokens past the first 5: the first 5 are untouched, the values moved as
    they are, every key re-rotated by -12 (what the reference rotation gives, to float16 rounding),
    and layer 0's keys (a function of token and position alone) those of a fresh forward of the
    shifted tokens at their new positions."""
    g = torch.Generator().manual_seed(7)
    toks = torch.randint(0, 1000, (40,), generator=g).tolist()
    n_keep, n_discard = 5, 12
    store = _store(tiny, backend)
    blocks = BlockManager(store)
    seq = SeqKV()
    blocks.reserve(seq, len(toks))
    tiny.forward(store, [SeqBatch(seq, toks, 0)])
    blocks.commit(seq, len(toks))
    k0, v0 = store.gather(seq, 0, len(toks))
    blocks.shift(seq, n_keep, n_discard)
    n = len(toks) - n_discard
    assert seq.n_tokens == n and len(seq.blocks) == blocks.blocks_needed(n)
    k1, v1 = store.gather(seq, 0, n)
    rot = tiny.key_rotation()
    for layer in range(len(tiny.layers)):
        assert torch.equal(k1[layer][:n_keep], k0[layer][:n_keep])
        assert torch.equal(v1[layer], torch.cat([v0[layer][:n_keep], v0[layer][n_keep + n_discard:]]))
        want = ref.rope(k0[layer][n_keep + n_discard:].float(), torch.full((n - n_keep,), -n_discard),
                        rot.inv_freqs[layer], rot.neox, rot.theta_scales[layer])
        err = (k1[layer][n_keep:].float() - want).abs().max().item()
        assert err <= 2e-3 * want.abs().max().item(), (layer, err)
        assert not torch.equal(k1[layer][n_keep:], k0[layer][n_keep + n_discard:])  # (it did rotate)
    fresh = _store(tiny, "torch")
    seq2 = SeqKV()
    BlockManager(fresh).reserve(seq2, n)
    tiny.forward(fresh, [SeqBatch(seq2, toks[:n_keep] + toks[n_keep + n_discard:], 0)])
    k2, _ = fresh.gather(seq2, 0, n)
    err = (k1[0].float() - k2[0].float()).abs().max().item()
    assert err <= 4e-3 * k2[0].float().abs().max().item(), err


def test_shift_copies_shared_blocks_first(tiny):
    store = _store(tiny, "cpu")
    blocks = BlockManager(store)
    seq = SeqKV()
    toks = list(range(1, 41))
    blocks.reserve(seq, 40)
    tiny.forward(store, [SeqBatch(seq, toks, 0)])
    blocks.commit(seq, 40)
    other = blocks.share_prefix(seq, 40)
    before = store.gather(other, 0, 40)
    blocks.shift(seq, 4, 20)
    after = store.gather(other, 0, 40)
    assert all(torch.equal(a, b) for a, b in zip(before[0] + before[1], after[0] + after[1]))
    assert seq.n_tokens == 20 and seq.blocks[0] != other.blocks[0] and seq.blocks[1] != other.blocks[1]


@pytest.fixture(scope="module")
def shifting_engine(tiny_path):
    from runtime.serving import Engine, EngineConfig

    lines: list[str] = []
    e = Engine(EngineConfig(model_path=str(tiny_path), n_ctx=256, n_parallel=1, ctx_shift=True, warmup=False,
                            log=lambda level, msg: lines.append(msg)))
    e.load()
    e.start()
    e.lines = lines
    yield e
    e.stop()


def test_tokens_and_shifts_match_llama_server(shifting_engine, api_client, tiny_path):
    if float_order() != "avx2":
        pytest.skip("recorded in llama.cpp's AVX2 float order (the reference binary's build)")
    rec = json.loads(REFERENCE.read_text())
    assert hashlib.sha256(tiny_path.read_bytes()).hexdigest() == rec["sha256"], \
        "the built-in model changed: rerun scripts/record_ctx_shift_reference.py"
    with api_client(shifting_engine) as c:
        for case in rec["cases"]:
            seen = len(shifting_engine.lines)
            got = c.post("/completion", json={**case["request"], **rec["request_fields"]}).json()
            shifts = [[int(x.split(" = ")[1]) for x in line.split("slot context shift, ")[1].split(", ")]
                      for line in shifting_engine.lines[seen:] if "slot context shift" in line]
            assert shifts == case["shifts"], case["request"]
            assert (got["truncated"], got["timings"]["predicted_n"]) == (case["truncated"], case["predicted_n"])
            assert got["tokens"] == case["tokens"], case["request"]


def test_without_the_flag_generation_stops_at_the_context(tiny_path, api_client):
    from runtime.serving import Engine, EngineConfig

    e = Engine(EngineConfig(model_path=str(tiny_path), n_ctx=256, n_parallel=1, warmup=False, verbosity=0))
    e.load()
    e.start()
    try:
        with api_client(e) as c:
            got = c.post("/completion", json={"prompt": list(range(1, 11)), "n_predict": 600,
                                              "cache_prompt": False, "temperature": 0}).json()
        assert got["truncated"] is True and got["timings"]["predicted_n"] == 256 - 10
    finally:
        e.stop()


def test_flags_and_echo(api_engine, api_client):
    from api.cli import engine_config, server_config
    from api.cli_args import build_parser, refusal
    from api.context import RequestDefaults

    args = build_parser().parse_args(["-m", "x.gguf", "--context-shift", "--keep", "-1"], environ={})
    scfg = server_config(args)
    assert engine_config(args, scfg).ctx_shift and scfg.request_defaults.n_keep == -1
    args = build_parser().parse_args(["-m", "x.gguf", "--context-shift", "--no-context-shift"], environ={})
    assert not engine_config(args, server_config(args)).ctx_shift
    assert refusal(build_parser().parse_args(["--context-shift"], environ={})) is None
    with api_client(api_engine, request_defaults=RequestDefaults(n_keep=3)) as c:
        s = c.post("/completion", json={"prompt": "hi", "n_predict": 1, "n_discard": 7}).json()["generation_settings"]
        assert (s["n_keep"], s["n_discard"]) == (3, 7)
        assert c.get("/props").json()["default_generation_settings"]["params"]["n_keep"] == 3
