"""--spec-type ngram-cache and -lcs / -lcd (runtime/serving/ngram_cache.py) against llama.cpp b1-0c1e570's
own code: the drafts of common_speculative_impl_ngram_cache over a scripted multi-slot run, the files
common_ngram_cache_save writes (byte for byte, both ways) and the growth of libstdc++'s maps, all
recorded by scripts/record_ngram_cache_reference.py (scripts/ngram_cache_ref.cpp + common/ngram-cache.cpp);
then greedy outputs unchanged by it on a tiny model, and the flags through the server."""
from __future__ import annotations

import hashlib
import json
import struct
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from runtime.serving import ngram_cache as nc
from runtime.serving.ngram_cache import NgramCache, NgramCacheDrafter, cache_draft
from tests.test_speculative import baseline, tiny_path  # noqa: F401 - the tiny model and its plain outputs

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data"
REF = json.loads((DATA / "ngram_cache_reference.json").read_text())
STATIC = DATA / "ngram_cache_static.bin"


def _dump(c: NgramCache) -> str:
    """The C++ harness's `dump` line."""
    rows = sorted(" ".join(map(str, k)) + " :" + "".join(f" {t} {n}" for t, n in sorted(p.items()))
                  for k, p in c.parts.items())
    return f"dump {len(rows)}" + "".join(f" | {r}" for r in rows)


def test_map_growth_is_libstdcxx():
    assert list(nc.GROWTH) == REF["growth"]


def test_files_byte_for_byte_both_ways(tmp_path):
    # llama-lookup-create's file (2-grams) loads; saved again, the bytes llama.cpp writes after its
    # own load (a loaded map holds its n-grams in another order than the one that was saved)
    c = NgramCache.load(STATIC)
    out = tmp_path / "again.bin"
    c.save(out)
    assert hashlib.sha256(out.read_bytes()).hexdigest() == REF["static_resaved_sha256"]
    # the same cache built here from the corpus: the bytes llama.cpp wrote
    built = NgramCache()
    toks = REF["static_tokens"]
    built.update(toks, len(toks), nc.NGRAM_STATIC, nc.NGRAM_STATIC)
    built.save(out)
    assert out.read_bytes() == STATIC.read_bytes() and len(built) > 100
    # a 1..4-gram cache (what -lcd holds): the sha256 of the file llama.cpp wrote
    full = NgramCache()
    full.update(REF["dynamic_tokens"], len(REF["dynamic_tokens"]))
    full.save(out)
    assert hashlib.sha256(out.read_bytes()).hexdigest() == REF["dynamic_sha256"]
    assert NgramCache.load(out).parts == full.parts


def test_hand_built_file_loads_as_llama_cpp_loads_it(tmp_path):
    # a repeated n-gram and a repeated follower keep their first entry; 7 stray bytes are ignored
    p = tmp_path / "odd.bin"
    p.write_bytes(bytes.fromhex(REF["odd_hex"]))
    assert _dump(NgramCache.load(p)) == REF["odd_dump"]
    rec = struct.pack("<5i", 1, 2, -1, -1, 1) + struct.pack("<2i", 3, 4)
    for bad in (rec[:-4], struct.pack("<5i", 1, 2, -1, -1, 0), rec[:-4] + struct.pack("<i", 0), rec[:18]):
        p.write_bytes(bad)
        with pytest.raises(ValueError):
            NgramCache.load(p)


def test_drafts_match_llama_cpp():
    tasks = REF["tasks"]
    n_drafted = 0
    for run in REF["runs"]:
        d = NgramCacheDrafter(3, str(STATIC) if run["static"] else "", "")
        if run["dynamic"]:
            d.dynamic.update(REF["dynamic_tokens"], len(REF["dynamic_tokens"]))
        for sid, ti, n, want in run["calls"]:
            task = tasks[ti]
            got = d.draft(sid, task[:n], task[n])
            assert got == want, (sid, ti, n)
            n_drafted += bool(want)
    assert n_drafted > 50


def test_draft_rules():
    ctx, empty = NgramCache(), NgramCache()
    hist = [1, 2, 3, 4, 1, 2, 3, 5, 1, 2, 3]
    ctx.update(hist, len(hist))
    # [1, 2, 3] -> 4 once, 5 once: a 50% tie passes the lax 50% of 3-grams; [2, 3] the same;
    # the 4-gram [3, 1, 2, 3] is unseen; the first follower in libstdc++'s order wins the tie
    assert cache_draft(hist, 3, 1, ctx, empty, empty) == [nc.stl_order([4, 5], [4, 5])[0]]
    # the static cache validates: its 2-gram [2, 3] -> 5 makes 5 win
    static = NgramCache()
    static.update([2, 3, 5], 3, 2, 2)
    assert cache_draft(hist, 3, 1, ctx, empty, static) == [5]
    assert cache_draft([7], 7, 8, ctx, empty, static) == []  # too short a history


def test_missing_or_bad_file_fails_the_load(tmp_path):
    with pytest.raises(nc.LookupCacheError, match="failed to open static lookup cache"):
        NgramCacheDrafter(1, str(tmp_path / "nope.bin"))
    bad = tmp_path / "bad.bin"
    bad.write_bytes(struct.pack("<5i", 1, 2, -1, -1, 0))
    with pytest.raises(nc.LookupCacheError, match="failed to open dynamic lookup cache"):
        NgramCacheDrafter(1, "", str(bad))


# ---- the engine and the server -----------------------------------------------------------------

def test_greedy_identical_with_lookup_caches(tiny_path, baseline, tmp_path):
    """Caches made from the model's own earlier output (as a -lcd of past generations would be):
    many drafts accepted, the tokens unchanged."""
    from runtime.spec_config import SpecConfig, SpecType
    from tests.test_speculative import PROMPTS, _engine, _generate

    dyn, static = NgramCache(), NgramCache()
    for r in baseline["plain"] * 2:  # seen twice: the strict thresholds want at least 2 to 4 samples
        dyn.update(r.tokens, len(r.tokens))
        static.update(r.tokens, len(r.tokens), 2, 2)
    dyn.save(tmp_path / "d.bin")
    static.save(tmp_path / "s.bin")
    spec = SpecConfig(types=(SpecType.NGRAM_CACHE,), lookup_cache_static=str(tmp_path / "s.bin"),
                      lookup_cache_dynamic=str(tmp_path / "d.bin"))
    e = _engine(tiny_path, spec)
    try:
        got = _generate(e, PROMPTS, 120)
    finally:
        e.stop()
    for a, b in zip(baseline["plain"], got):
        assert b.tokens == a.tokens and b.tokens_cached == a.tokens_cached
    assert all(r.timings.draft_n_accepted > 20 for r in got), [r.timings.draft_n_accepted for r in got]


def test_server_lookup_cache_flags(start_server, tiny_path, baseline, tmp_path):
    # -lcd: the model's own earlier answer (seen twice); -lcs: llama-lookup-create's file
    dyn = NgramCache()
    for _ in range(2):
        dyn.update(baseline["plain"][0].tokens, len(baseline["plain"][0].tokens))
    dyn.save(tmp_path / "d.bin")
    srv = start_server("-m", tiny_path, "-c", "1024", "-np", "2", "--metrics", "--spec-type", "ngram-cache",
                       "-lcs", str(STATIC), "-lcd", str(tmp_path / "d.bin"))
    prompt = "def f(x):\n    return x + 1\n" * 12  # PROMPTS[0]
    j = httpx.post(srv.url + "/completion", json={"prompt": prompt, "n_predict": 120, "temperature": 0,
                                                  "id_slot": 1}, timeout=120).json()
    t = j["timings"]
    assert j["generation_settings"]["speculative.types"] == "none,ngram-cache"
    assert t["draft_n"] > 0 and t["draft_n_accepted"] > 0  # drafts from the dynamic cache
    # /slots: the slot's speculation numbers (tritium's `speculative_stats`), the other slot none
    slots = httpx.get(srv.url + "/slots", timeout=30).json()
    st = slots[1]["speculative_stats"]
    assert "speculative_stats" not in slots[0]
    assert (st["draft_n"], st["draft_n_accepted"]) == (t["draft_n"], t["draft_n_accepted"])
    assert 0 < st["n_verify_steps"] <= t["draft_n"] and 0 <= st["draft_n_max"] <= 8
    assert len(st["n_accepted_per_pos"]) == 8 and sum(st["n_accepted_per_pos"]) == t["draft_n_accepted"]
    # /metrics: llama-server's counters and its per-position series
    text = httpx.get(srv.url + "/metrics", timeout=30).text
    vals = dict(x.rsplit(" ", 1) for x in text.splitlines() if x and not x.startswith("#"))
    assert float(vals["llamacpp:spec_decode_num_draft_tokens_total"]) == t["draft_n"]
    assert float(vals["llamacpp:spec_decode_num_accepted_tokens_total"]) == t["draft_n_accepted"]
    assert float(vals["llamacpp:spec_decode_num_drafts_total"]) == st["n_verify_steps"]
    per_pos = [int(vals[f'llamacpp:spec_decode_num_accepted_tokens_per_pos_total{{position="{i}"}}']) for i in range(8)]
    assert per_pos == st["n_accepted_per_pos"]
    assert "# TYPE llamacpp:spec_decode_num_accepted_tokens_per_pos_total counter" in text
    # a file that cannot be read ends the start-up, as llama-server's GGML_ABORT does
    r = subprocess.run([sys.executable, "-m", "api.cli", "-m", tiny_path, "--port", "0", "--spec-type", "ngram-cache",
                        "-lcd", str(tmp_path / "missing.bin")], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert r.returncode == 1 and "failed to open dynamic lookup cache" in r.stderr
