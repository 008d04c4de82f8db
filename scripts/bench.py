#!/usr/bin/env python3
"""Throughput / latency benchmark for any llama-server compatible endpoint.

    python scripts/bench.py http://127.0.0.1:8080 [--compare http://127.0.0.1:8081]

Drives streamed ``POST /completion`` requests (``stream: true``, ``temperature: 0``,
``ignore_eos: true``, ``cache_prompt: false``) with a fixed, seeded workload: for every
concurrency level a list of requests whose prompt length (in tokens, measured with the
server's own ``/tokenize``) and ``n_predict`` are drawn from the given ranges. ``c`` workers
pull the requests from a shared queue (closed loop), so at most ``c`` streams are open.

One JSON line per concurrency level goes to stdout (progress goes to stderr):

    gen_tokens_per_s           sum of generated tokens / wall time of the level
    ttft_ms_median, ttft_ms_p95 request sent -> first streamed token
    decode_tokens_per_s_median per stream: (tokens - 1) / (last token time - first token time);
                               the first token comes from the prefill, so it is not a decode step
    requests_per_s             completed requests / wall time
    server, errors, ...

With ``--compare URL2`` the same workload (same seed, same prompts) runs against URL2 after
BASE_URL, and one ratio line per level follows (BASE_URL / URL2, i.e. tritium / reference).

Only the standard library and httpx are used.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_sse import (CompletionStream, RequestResult, SSEParser, StreamError,  # noqa: E402, F401
                       check_chat_stream)

# A deterministic word list (common English words). Prompts are seeded draws from it.
WORDS: tuple[str, ...] = tuple(
    """
    time year people way day man thing woman life child world school state family student
    group country problem hand part place case week company system program question work
    government number night point home water room mother area money story fact month lot
    right study book eye job word business issue side kind head house service friend father
    power hour game line end member law car city community name president team minute idea
    kid body information back parent face others level office door health person art war
    history party result change morning reason research girl guy moment air teacher force
    education foot boy age policy process music market sense nation plan college interest
    death experience effect class control care field development role effort rate heart
    drug show leader light voice wife police mind price report decision son view
    relationship town road arm difference value building action model season society tax
    director position player record paper space ground form event official matter center
    couple site project activity star table need court oil situation cost industry figure
    street image phone data picture practice piece land product doctor wall patient worker
    news test movie north love support technology step baby computer type attention film
    tree source organization hair window evidence population site river garden bridge
    small large early young important public bad same able little long great old big high
    different local social national free strong human true whole clear recent certain open
    """.split()
)

# Short words used to pad a prompt up to the exact token target.
FILLERS: tuple[str, ...] = ("the", "a", "of", "to", "and", "in", "is", "it")

PRESETS: dict[str, dict] = {
    # Issue text: "64 generated tokens after a ~600-token prompt", reference at 1 and 4 streams.
    "lesson": {"prompt_tokens": (600, 600), "gen_tokens": (64, 64), "concurrency": [1, 4]},
    # Issue 11 (quantized models on the CPU): 64 generated tokens after a ~430-token prompt, 1 and 4
    # streams, 4 requests per level; "model" is what scripts/bench_servers.py starts both servers on
    # (the real models: scripts/fetch_models.py; q15b: a generated 1.5B-shaped qwen2 Q4_K_M file,
    # made by scripts/make_tiny_model.py there).
    "qwen05b": {"prompt_tokens": (430, 430), "gen_tokens": (64, 64), "concurrency": [1, 4],
                "requests_per_level": 4, "model": "qwen2.5-coder-0.5b"},
    "q15b": {"prompt_tokens": (430, 430), "gen_tokens": (64, 64), "concurrency": [1, 4],
             "requests_per_level": 4, "model": "/tmp/tritium-q15b-q4_k_m.gguf"},
    "gemma270m": {"prompt_tokens": (256, 256), "gen_tokens": (64, 64), "concurrency": [1, 4],
                  "requests_per_level": 4, "model": "gemma-3-270m"},
    # issue 35: the default model, SmolLM2-135M-Instruct Q4_1 (scripts/fetch_models.py)
    "smollm2": {"prompt_tokens": (256, 256), "gen_tokens": (64, 64), "concurrency": [1, 4],
                "requests_per_level": 4, "model": "smollm2-135m-instruct"},
}
QUICK = {"prompt_tokens": (100, 300), "gen_tokens": (16, 32), "concurrency": [1, 4],
         "requests_per_level": 4}
DEFAULTS = {"prompt_tokens": (100, 2000), "gen_tokens": (64, 512), "concurrency": [1, 4, 8],
            "requests_per_level": None}  # None: 4 * concurrency, at least 8



def percentile(values: Iterable[float], q: float) -> float | None:
    """Linear-interpolated percentile (numpy's default), q in [0, 100]; None when empty."""
    xs = sorted(values)
    if not xs:
        return None
    pos = (len(xs) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def summarize(results: list[RequestResult], wall_s: float, concurrency: int,
              server: str) -> dict:
    """One JSON-able line for a concurrency level."""
    ok = [r for r in results if r.ok]
    ttft_ms = [r.ttft_s * 1000.0 for r in ok if r.ttft_s is not None]
    dec = [r.decode_tokens_per_s for r in ok if r.decode_tokens_per_s is not None]
    gen = sum(r.n_gen for r in ok)
    prompts = [r.n_prompt for r in ok if r.n_prompt]

    def rnd(x: float | None, nd: int = 2) -> float | None:
        return None if x is None else round(x, nd)

    return {
        "server": server,
        "concurrency": concurrency,
        "requests": len(results),
        "errors": len(results) - len(ok),
        "gen_tokens_per_s": rnd(gen / wall_s if wall_s > 0 else None),
        "ttft_ms_median": rnd(percentile(ttft_ms, 50)),
        "ttft_ms_p95": rnd(percentile(ttft_ms, 95)),
        "decode_tokens_per_s_median": rnd(percentile(dec, 50)),
        "requests_per_s": rnd(len(ok) / wall_s if wall_s > 0 else None, 3),
        "gen_tokens": gen,
        "prompt_tokens_mean": rnd(sum(prompts) / len(prompts) if prompts else None, 1),
        "wall_s": rnd(wall_s, 3),
    }


RATIO_KEYS = ("gen_tokens_per_s", "ttft_ms_median", "ttft_ms_p95",
              "decode_tokens_per_s_median", "requests_per_s", "peak_rss_mib")


def ratio_line(a: dict, b: dict) -> dict:
    """a / b per metric (None where either side is missing or b is 0)."""
    na, nb = a["server"], b["server"]
    if na == nb:  # same build and model name: tell them apart by URL
        na, nb = a.get("url", na + " (1)"), b.get("url", nb + " (2)")
    out: dict = {"ratio": f"{na} / {nb}", "concurrency": a["concurrency"]}
    for k in RATIO_KEYS:
        x, y = a.get(k), b.get(k)
        out[k] = round(x / y, 3) if x is not None and y else None
    out["errors"] = [a["errors"], b["errors"]]
    return out


# ----------------------------------------------------------------------------- workload
@dataclass(frozen=True)
class WorkItem:
    prompt_tokens: int   # target prompt length, tokens as the server counts them
    gen_tokens: int      # n_predict
    word_seed: str       # seeds the prompt's words


def make_workload(seed: int, concurrency: int, n: int, prompt_range: tuple[int, int],
                  gen_range: tuple[int, int]) -> list[WorkItem]:
    rng = random.Random(f"tritium-bench:{seed}:{concurrency}")
    return [WorkItem(rng.randint(*prompt_range), rng.randint(*gen_range),
                     f"{seed}:{concurrency}:{i}") for i in range(n)]


def prompt_words(word_seed: str, n: int) -> list[str]:
    rng = random.Random(word_seed)
    return [rng.choice(WORDS) for _ in range(n)]


@dataclass
class Server:
    url: str
    client: httpx.AsyncClient
    n_tokenize: int = 0
    _cache: dict = field(default_factory=dict)

    async def count_tokens(self, text: str) -> int:
        """Tokens /completion will evaluate for this prompt (BOS included if the model adds one)."""
        if text in self._cache:
            return self._cache[text]
        r = await self.client.post(self.url + "/tokenize",
                                   json={"content": text, "add_special": True})
        r.raise_for_status()
        self.n_tokenize += 1
        n = len(r.json()["tokens"])
        self._cache[text] = n
        return n


async def build_prompt(server: Server, item: WorkItem) -> tuple[str, int]:
    """Text whose token count is item.prompt_tokens (or just below when it cannot be hit).

    Binary search for the longest prefix of the seeded word sequence that fits, then pad with
    short filler words one at a time while that still fits.
    """
    target = item.prompt_tokens
    words = prompt_words(item.word_seed, target)  # every word is >= 1 token
    lo, hi = 0, len(words)   # invariant: count(lo words) <= target (0 words: only specials)
    if await server.count_tokens(" ".join(words)) <= target:
        lo = hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if await server.count_tokens(" ".join(words[:mid])) <= target:
            lo = mid
        else:
            hi = mid
    kept = words[:lo]
    n = await server.count_tokens(" ".join(kept)) if kept else 0
    for i in range(16):
        if n >= target:
            break
        cand = kept + [FILLERS[i % len(FILLERS)]]
        m = await server.count_tokens(" ".join(cand))
        if m > target:
            continue
        kept, n = cand, m
    return " ".join(kept), n


# ----------------------------------------------------------------------------- requests
async def stream_completion(client: httpx.AsyncClient, url: str, prompt: str,
                            n_predict: int) -> RequestResult:
    body = {"prompt": prompt, "n_predict": n_predict, "stream": True, "temperature": 0,
            "ignore_eos": True, "cache_prompt": False, "return_tokens": True}
    res = RequestResult(ok=False, n_predict=n_predict)
    for attempt in (1, 2):
        # a keep-alive connection the server closed while idle fails before any byte comes back:
        # that one attempt is repeated on a fresh connection (llama-server does this now and then)
        parser = SSEParser()
        st = CompletionStream()
        got_bytes = False
        res.t_start = time.perf_counter()
        try:
            async with client.stream("POST", url + "/completion", json=body) as r:
                got_bytes = True
                if r.status_code != 200:
                    text = (await r.aread()).decode("utf-8", "replace")
                    raise StreamError(f"HTTP {r.status_code}: {text[:200]}")
                async for chunk in r.aiter_bytes():
                    now = time.perf_counter()
                    for ev in parser.feed(chunk):
                        st.on_event(ev, now)
                for ev in parser.close():
                    st.on_event(ev, time.perf_counter())
            if not st.stopped:
                raise StreamError("stream ended without a chunk with stop=true")
            res.ok, res.error = True, ""
            break
        except (httpx.RemoteProtocolError, httpx.ConnectError, httpx.ReadError) as e:
            res.error = f"{type(e).__name__}: {e}"
            if got_bytes or attempt == 2:
                break
        except (StreamError, httpx.HTTPError, UnicodeDecodeError) as e:
            res.error = f"{type(e).__name__}: {e}"
            break
    res.t_end = time.perf_counter()
    res.t_first, res.t_last = st.t_first, st.t_last
    res.n_gen, res.n_prompt = st.n_gen, st.n_prompt
    return res


async def run_level(client: httpx.AsyncClient, url: str, jobs: list[tuple[str, int]],
                    concurrency: int) -> tuple[list[RequestResult], float]:
    """Run (prompt, n_predict) jobs with `concurrency` workers; returns results and wall time."""
    queue: asyncio.Queue = asyncio.Queue()
    for j in jobs:
        queue.put_nowait(j)
    results: list[RequestResult] = []

    async def worker() -> None:
        while True:
            try:
                prompt, n_predict = queue.get_nowait()
            except asyncio.QueueEmpty:
                return
            results.append(await stream_completion(client, url, prompt, n_predict))

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return results, time.perf_counter() - t0


async def server_label(client: httpx.AsyncClient, url: str) -> str:
    try:
        r = await client.get(url + "/props")
        p = r.json() if r.status_code == 200 else {}
    except (httpx.HTTPError, ValueError):
        p = {}
    parts = [str(p[k]) for k in ("build_info", "model_alias") if p.get(k)]
    if not parts and p.get("model_path"):
        parts.append(str(p["model_path"]).rsplit("/", 1)[-1])
    return " ".join(parts) or url


async def slot_context(client: httpx.AsyncClient, url: str) -> int | None:
    try:
        r = await client.get(url + "/props")
        return int(r.json()["default_generation_settings"]["n_ctx"])
    except (httpx.HTTPError, ValueError, KeyError, TypeError):
        return None


async def wait_healthy(client: httpx.AsyncClient, url: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if (await client.get(url + "/health")).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise SystemExit(f"{url}/health did not answer 200 within {timeout_s:.0f} s")
        await asyncio.sleep(0.5)


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


async def bench_server(url: str, opts: argparse.Namespace, label: str | None, pid: int | None = None) -> list[dict]:
    url = url.rstrip("/")
    headers = {"Authorization": f"Bearer {opts.api_key}"} if opts.api_key else {}
    max_c = max(opts.concurrency)
    async with httpx.AsyncClient(
            headers=headers, trust_env=False,
            timeout=httpx.Timeout(opts.timeout, connect=10.0),
            limits=httpx.Limits(max_connections=max_c + 2,
                                max_keepalive_connections=max_c + 2)) as client:
        await wait_healthy(client, url, opts.wait)
        label = label or await server_label(client, url)
        n_ctx = await slot_context(client, url)
        need = opts.prompt_tokens[1] + opts.gen_tokens[1]
        if n_ctx is not None and need > n_ctx:
            log(f"warning: {label}: slot context {n_ctx} < max prompt + gen ({need}); "
                "long requests may be truncated or fail")
        server = Server(url, client)
        if opts.warmup:
            await stream_completion(client, url, "warm up", 4)
        lines = []
        for c in opts.concurrency:
            n = opts.requests_per_level or max(8, 4 * c)
            items = make_workload(opts.seed, c, n, opts.prompt_tokens, opts.gen_tokens)
            jobs = []
            for it in items:
                text, _ = await build_prompt(server, it)
                jobs.append((text, it.gen_tokens))
            log(f"{label}: concurrency {c}: {n} requests ...")
            results, wall = await run_level(client, url, jobs, c)
            line = summarize(results, wall, c, label)
            line["url"] = url
            errs = [r.error for r in results if not r.ok]
            if errs:
                line["first_error"] = errs[0][:300]
            rss = peak_rss_mib(pid)
            if rss is not None:
                line["peak_rss_mib"] = rss
            lines.append(line)
            print(json.dumps(line), flush=True)
        return lines


def peak_rss_mib(pid: int | None) -> float | None:
    """The server process's peak resident set so far (VmHWM of /proc/PID/status), MiB."""
    if not pid:
        return None
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as f:
            for row in f:
                if row.startswith("VmHWM:"):
                    return round(int(row.split()[1]) / 1024, 1)
    except OSError:
        return None
    return None


# ----------------------------------------------------------------------------- CLI
def parse_range(s: str) -> tuple[int, int]:
    lo, sep, hi = s.partition("-")
    a, b = int(lo), int(hi) if sep else int(lo)
    if a < 1 or b < a:
        raise argparse.ArgumentTypeError(f"bad range {s!r} (want MIN-MAX, 1 <= MIN <= MAX)")
    return a, b


def parse_levels(s: str) -> list[int]:
    levels = [int(x) for x in s.split(",") if x.strip()]
    if not levels or min(levels) < 1:
        raise argparse.ArgumentTypeError(f"bad concurrency list {s!r}")
    return levels


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("base_url", help="server to measure, e.g. http://127.0.0.1:8080")
    p.add_argument("--compare", metavar="URL2", help="reference server; prints ratio lines")
    p.add_argument("--concurrency", type=parse_levels, help="levels, default 1,4,8")
    p.add_argument("--requests-per-level", type=int,
                   help="requests per level (default max(8, 4 x concurrency))")
    p.add_argument("--prompt-tokens", type=parse_range, metavar="MIN-MAX",
                   help="prompt length range in tokens (default 100-2000)")
    p.add_argument("--gen-tokens", type=parse_range, metavar="MIN-MAX",
                   help="n_predict range (default 64-512)")
    p.add_argument("--preset", choices=sorted(PRESETS),
                   help="lesson: ~600-token prompt, 64 generated tokens, concurrency 1,4; qwen05b / q15b: "
                        "~430-token prompt, 64 tokens, 1,4; gemma270m / smollm2: 256-token prompt, 64 tokens "
                        "(scripts/bench_servers.py starts the servers)")
    p.add_argument("--pid", type=int, help="BASE_URL's server process: adds its peak RSS (VmHWM) per level")
    p.add_argument("--compare-pid", type=int, help="URL2's server process, the same")
    p.add_argument("--quick", action="store_true", help="small run (smoke test)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--label", help="name for BASE_URL in the output (default from /props)")
    p.add_argument("--compare-label", help="name for URL2 in the output")
    p.add_argument("--api-key", help="sent as Authorization: Bearer KEY")
    p.add_argument("--timeout", type=float, default=600.0, help="per-request timeout, s")
    p.add_argument("--wait", type=float, default=60.0, help="wait for /health 200, s")
    p.add_argument("--no-warmup", dest="warmup", action="store_false")
    p.add_argument("--out", metavar="FILE.jsonl", help="also append the lines to this file")
    return p


def resolve_options(opts: argparse.Namespace) -> argparse.Namespace:
    """Explicit flags > --preset > --quick > defaults."""
    layers = [DEFAULTS]
    if opts.quick:
        layers.append(QUICK)
    if opts.preset:
        layers.append(PRESETS[opts.preset])
    for key in ("prompt_tokens", "gen_tokens", "concurrency", "requests_per_level"):
        if getattr(opts, key) is None:
            for layer in reversed(layers):
                if key in layer:
                    setattr(opts, key, layer[key])
                    break
    return opts


async def amain(opts: argparse.Namespace) -> list[dict]:
    lines = await bench_server(opts.base_url, opts, opts.label, opts.pid)
    if opts.compare:
        ref = await bench_server(opts.compare, opts, opts.compare_label, opts.compare_pid)
        ratios = [ratio_line(a, b) for a, b in zip(lines, ref)]
        for r in ratios:
            print(json.dumps(r), flush=True)
        lines = lines + ref + ratios
    return lines


def main(argv: list[str] | None = None) -> int:
    opts = resolve_options(build_parser().parse_args(argv))
    lines = asyncio.run(amain(opts))
    if opts.out:
        with open(opts.out, "a", encoding="utf-8") as f:
            stamp = time.strftime("%Y-%m-%dT%H:%M:%S")
            for line in lines:
                f.write(json.dumps({"time": stamp, **line}) + "\n")
    return 1 if any(line.get("errors") for line in lines if "server" in line) else 0


if __name__ == "__main__":
    sys.exit(main())
