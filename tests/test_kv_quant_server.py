"""Quantized KV caches (-ctk / -ctv) in the server on the real Qwen model, against llama-server b1-0c1e570
with the same cache types (recorded by scripts/record_kv_quant_reference.py in llama.cpp's AVX2 order;
skipped on another float order and without the model): greedy tokens, the mean log-probability of a fixed
text within llama-server's own change from f16 to q8_0, the start log's KV size line, and a slot file
saved and restored with a quantized cache."""
from __future__ import annotations

import httpx
import pytest

from runtime.model.model_files import QWEN
from tests.llama_tokens import float_order, real_model_path, reference_file


def _recorded() -> dict:
    import json

    if float_order() != "avx2":
        pytest.skip("recorded in llama.cpp's AVX2 order only")
    path = reference_file("kv_quant_qwen.json")
    if not path.exists():
        pytest.skip(f"no recording for this float order ({path})")
    return json.loads(path.read_text())


@pytest.fixture(scope="module")
def rec():
    return _recorded()


@pytest.fixture(scope="module")
def servers(start_server, tmp_path_factory):
    started: dict[str, object] = {}
    slots = tmp_path_factory.mktemp("slots")

    def get(k: str, v: str):
        if (k, v) not in started:
            for s in started.values():  # one at a time: two cores
                s.stop()
            started.clear()
            started[(k, v)] = start_server("-m", str(real_model_path(QWEN)), "-c", "2048", "-np", "1", "-t", "2",
                                           "-ctk", k, "-ctv", v, "-lv", "4", "--slot-save-path", str(slots),
                                           wait=False).wait_ready(900)
        return started[(k, v)]

    yield get
    for s in started.values():
        s.stop()


def _greedy(srv, prompts: list[str], n: int) -> list[list[int]]:
    out = []
    for p in prompts:
        r = httpx.post(srv.url + "/completion", json={"prompt": p, "n_predict": n, "temperature": 0,
                                                      "cache_prompt": False, "return_tokens": True}, timeout=900)
        out.append(r.json()["tokens"])
    return out


def _text_logprobs(srv, ids: list[int], n_probs: int) -> list[float | None]:
    out = []
    for k in range(1, len(ids)):
        r = httpx.post(srv.url + "/completion", json={"prompt": ids[:k], "n_predict": 1, "n_probs": n_probs,
                                                      "temperature": 0, "cache_prompt": True}, timeout=900).json()
        top = r["completion_probabilities"][0]["top_logprobs"]
        out.append(next((t["logprob"] for t in top if t["id"] == ids[k]), None))
    return out


def test_text_logprob_within_llama_servers_change(rec, servers):
    """The mean log-probability of the text's tokens (those in llama-server's top n_probs with f16 and
    with q8_0 caches) with q8_0 caches: tritium's differs from llama-server's q8_0 by no more than
    llama-server's own f16 -> q8_0 change (tritium's f16 path: tests/test_real_models.py)."""
    f16, q8 = rec["configs"]["f16/f16"], rec["configs"]["q8_0/q8_0"]
    ids = q8["text_ids"]
    ours = _text_logprobs(servers("q8_0", "q8_0"), ids, rec["n_probs"])
    keep = [i for i in range(len(ids) - 1) if None not in (f16["text_logprobs"][i], q8["text_logprobs"][i], ours[i])]
    assert len(keep) >= len(ids) // 2

    def mean(xs):
        return sum(xs[i] for i in keep) / len(keep)

    theirs_change = abs(mean(q8["text_logprobs"]) - mean(f16["text_logprobs"]))
    assert theirs_change > 0  # the recording's two cache types differ on this text
    assert abs(mean(ours) - mean(q8["text_logprobs"])) <= theirs_change


def test_start_log_reports_the_kv_size_and_a_slot_file_round_trips(rec, servers):
    srv = servers("q8_0", "q8_0")
    line = next(ln for ln in srv.log().splitlines() if "llama_kv_cache: size" in ln)
    # llama-server -c 2048 -np 2 -ctk q8_0 -ctv q4_0 -lv 4: "size =    9.75 MiB (  1024 cells,  24 layers,
    # 2/2 seqs), K (q8_0):    6.38 MiB, V (q4_0):    3.38 MiB"; here -np 1 (one stream of 2048 cells), V q8_0
    assert "size =   12.75 MiB (  2048 cells,  24 layers,  1/1 seqs), K (q8_0):    6.38 MiB, V (q8_0):    6.38 MiB" in line, line
    # the prompt evaluated whole (as recorded), saved, overwritten, restored: the restored cache's
    # continuation (its last prompt token evaluated alone) is llama-server's
    body = {"prompt": rec["prompts"][0], "n_predict": 8, "temperature": 0, "id_slot": 0, "return_tokens": True}
    first = httpx.post(srv.url + "/completion", json=dict(body, cache_prompt=False), timeout=900).json()
    assert first["tokens"] == rec["configs"]["q8_0/q8_0"]["greedy"][0][:8]
    assert httpx.post(srv.url + "/slots/0?action=save", json={"filename": "q.bin"}, timeout=900).status_code == 200
    httpx.post(srv.url + "/completion", json=dict(body, prompt="Something else entirely.", cache_prompt=False),
               timeout=900)
    assert httpx.post(srv.url + "/slots/0?action=restore", json={"filename": "q.bin"}, timeout=900).status_code == 200
    again = httpx.post(srv.url + "/completion", json=dict(body, cache_prompt=True), timeout=900).json()
    assert again["timings"]["cache_n"] > 0 and again["tokens"] == first["tokens"]


# last (two server starts in all, CI time: the tests above use the q8_0 one): q8_0 and a 4-bit type;
# every type and mixed K / V pairs are bit-exact against llama.cpp's kernels in tests/test_kv_quant.py
@pytest.mark.parametrize("pair", ["q8_0/q8_0", "q4_0/q4_0"])
def test_greedy_tokens_equal_llama_servers(rec, servers, pair):
    k, v = pair.split("/")
    want = rec["configs"][pair]["greedy"]
    got = _greedy(servers(k, v), rec["prompts"], rec["n_predict"])
    same = [g == w for g, w in zip(got, want)]
    assert all(same), [(p[:20], sum(a == b for a, b in zip(g, w))) for p, g, w in zip(rec["prompts"], got, want)]
