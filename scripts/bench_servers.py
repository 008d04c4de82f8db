#!/usr/bin/env python3
"""tritium against llama-server on one GGUF file, same run: throughput, time to first token, peak
RSS, load time, and greedy agreement.

    python scripts/bench_servers.py --preset qwen05b [--llama /work/lsb/llama-server]
    python scripts/bench_servers.py --preset q15b          # generates the 1.5B-shaped model first
    python scripts/bench_servers.py --preset smollm2       # the default model, SmolLM2-135M-Instruct Q4_1
    python scripts/bench_servers.py --preset qwen05b --agreement-only
    PYTHONPATH=$PWD python scripts/bench_servers.py --preset qwen05b \
        --tritium-base "env PYTHONPATH=/tmp/ab-old $(which tritium-server)"   # A/B of two trees
    python scripts/bench_servers.py --preset code-edit --spec-type ngram-simple   # speculative decoding

`--preset code-edit` is scripts/bench_spec.py's workload (the real Qwen2.5-Coder-0.5B Q4_K_M, code
edits and prose, one stream and four, both servers with and without --spec-type); the rest of this
text is about the others.

Each server is started alone (`-np 4 -c 8192`, the preset's model, ports --port and --port + 1),
waited for (/health 200: the load time), measured with `scripts/bench.py`'s workload of the
preset, then (`--agreement`, default on) asked for the greedy continuation of 8 fixed prompts
(48 tokens, `/completion` with temperature 0), and stopped. Its peak RSS is the kernel's
high-water mark of the process (VmHWM) read just before it is stopped. One JSON line per server
and level, then the ratio lines (tritium / llama-server) and the agreement count, go to stdout;
a markdown table to stderr. `--tritium-base CMD` adds a second tritium (another tree or build, port
+ 2, run between llama-server and tritium by default) to the same run: its lines, a tritium / base
ratio line per level and a column in the table, for an A/B of a change. `--rounds N` then runs base and
tritium N - 1 more times, alternating which goes first (ABBA: load that drifts hits both alike), and ends with
one "tritium / base over rounds" line per level and metric: every round's ratio, the median and the spread,
and the 1-minute load average at the start of each run. Each server's CPU time over the workload (`cpu_s`,
user + system of its process from /proc) is printed too, with its tritium / base ratio over rounds: the same
requests' CPU cost is the A/B measure to read on a machine other work shares.

    PYTHONPATH=$PWD python scripts/bench_servers.py --preset qwen05b --rounds 4 \
        --tritium-base "env PYTHONPATH=/tmp/ab-old $(which tritium-server)"
"""
from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import os
import shlex
import signal
import subprocess
import sys
import time
import urllib.parse
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))
import bench  # noqa: E402

LLAMA = "/work/lsb/llama-server"
Q15B_PATH = "/tmp/tritium-q15b-q4_k_m.gguf"
VOCAB = REPO.parent / "shared" / "vocab" / "ggml-vocab-qwen2.gguf"
# the 1.5B-shaped qwen2 model (Qwen2.5-1.5B's shape, Q4_K_M mix of random valid blocks)
Q15B_ARGS = ["--type", "q4_k", "--arch", "qwen2", "--layers", "28", "--embd", "1536", "--heads", "12",
             "--kv-heads", "2", "--ff", "8960", "--ctx", "32768", "--rope-base", "1000000",
             "--rms-eps", "1e-6", "--random-blocks", "--name", "q15b-shaped-random", "--seed", "15"]

AGREEMENT_PROMPTS = [
    "def fibonacci(n):",
    "The capital of France is",
    "import numpy as np\n\ndef softmax(x):",
    "// A C function that reverses a string in place\nvoid reverse(char *s) {",
    "Once upon a time, in a small village,",
    "SELECT name, COUNT(*) FROM orders",
    "class Stack:\n    def __init__(self):",
    "Here is a list of prime numbers: 2, 3, 5,",
]
AGREEMENT_TOKENS = 48


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def model_path(preset: str) -> str:
    if preset == "q15b":
        if not Path(Q15B_PATH).exists():
            log(f"generating {Q15B_PATH} ...")
            subprocess.run([sys.executable, str(REPO / "scripts" / "make_tiny_model.py"), "--vocab", str(VOCAB),
                            "--out", Q15B_PATH, *Q15B_ARGS], check=True)
        return Q15B_PATH
    from runtime.model.model_files import MODELS, models_dir  # the real models: scripts/fetch_models.py
    key = bench.PRESETS[preset]["model"]
    return str(models_dir() / MODELS[key].filename) if key in MODELS else key


def peak_rss_mib(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def cpu_s(pid: int) -> float | None:
    """CPU seconds the process has used (user + system, its threads and reaped children): the same
    workload's CPU time is an A/B measure that other load on the machine disturbs far less than
    wall-clock rates (it still pays for shared caches and memory bandwidth)."""
    try:
        f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return sum(int(x) for x in f[11:15]) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


def start(cmd: list[str], log_path: str) -> subprocess.Popen:
    log("$ " + " ".join(cmd))
    f = open(log_path, "w")
    return subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)


def stop(p: subprocess.Popen) -> None:
    if p.poll() is None:
        os.killpg(p.pid, signal.SIGTERM)
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()


def health_status(url: str) -> int | None:
    """GET /health with the standard library: ~0.05 ms of CPU a poll. (`httpx.get` builds an SSL
    context per call, ~20 ms of CPU: polling every 20 ms with it took half a core from the server
    starting beside it on a 2-core machine, 0.3-0.5 s of tritium's load.)"""
    u = urllib.parse.urlsplit(url)
    c = http.client.HTTPConnection(u.hostname, u.port, timeout=2)
    try:
        c.request("GET", "/health")
        return c.getresponse().status
    except OSError:
        return None
    finally:
        c.close()


def wait_health(url: str, p: subprocess.Popen, timeout: float) -> float:
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < timeout:
        if p.poll() is not None:
            raise RuntimeError(f"server exited with {p.returncode} before /health answered")
        if health_status(url) == 200:
            return time.perf_counter() - t0
        time.sleep(0.02)  # the load time's resolution
    raise RuntimeError(f"{url}: not healthy after {timeout} s")


def greedy(url: str) -> list[list[int]]:
    out = []
    with httpx.Client(timeout=600, trust_env=False) as c:
        for prompt in AGREEMENT_PROMPTS:
            body = {"prompt": prompt, "n_predict": AGREEMENT_TOKENS, "temperature": 0, "return_tokens": True,
                    "cache_prompt": False}
            out.append(c.post(url + "/completion", json=body).json().get("tokens"))
    return out


def run_server(name: str, cmd: list[str], url: str, opts: argparse.Namespace) -> dict:
    p = start(cmd, f"/tmp/bench_servers-{name}.log")
    try:
        load_s = wait_health(url, p, opts.wait)
        cpu0 = cpu_s(p.pid)
        lines = [] if opts.agreement_only else asyncio.run(bench.bench_server(url, opts, name))
        cpu1 = cpu_s(p.pid)
        tokens = greedy(url) if opts.agreement or opts.agreement_only else None
        rss = peak_rss_mib(p.pid)
    finally:
        stop(p)
    work_cpu = round(cpu1 - cpu0, 2) if cpu0 is not None and cpu1 is not None else None
    return {"lines": lines, "tokens": tokens, "peak_rss_mib": rss, "load_s": load_s, "cpu_s": work_cpu}


AB_KEYS = ("decode_tokens_per_s_median", "gen_tokens_per_s", "ttft_ms_median")


def ab_rounds(res: dict, servers: dict, opts: argparse.Namespace, rounds: int) -> None:
    """Rounds 2..N of base against tritium, the first server alternating; prints each run's lines and the
    ratios over all rounds (round 1: the runs already in res)."""
    runs = [(res["tritium"], res["base"])]
    agreement = opts.agreement
    opts.agreement = False  # greedy agreement: round 1's
    for i in range(1, rounds):
        got = {}
        for name in (("tritium", "base") if i % 2 else ("base", "tritium")):
            cmd, url = servers[name]
            load = os.getloadavg()[0]
            got[name] = {**run_server(name, cmd, url, opts), "load_avg_1m": load}
            print(json.dumps({"server": name, "round": i + 1, "load_avg_1m": round(load, 1),  # (lines: above)
                              "peak_rss_mib": got[name]["peak_rss_mib"], "load_s": round(got[name]["load_s"], 2),
                              "cpu_s": got[name]["cpu_s"]}),
                  flush=True)
        runs.append((got["tritium"], got["base"]))
    opts.agreement = agreement
    cpu = [round(t["cpu_s"] / b["cpu_s"], 3) for t, b in runs if t.get("cpu_s") and b.get("cpu_s")]
    if cpu:
        xs = sorted(cpu)
        med = xs[len(xs) // 2] if len(xs) % 2 else (xs[len(xs) // 2 - 1] + xs[len(xs) // 2]) / 2
        print(json.dumps({"ratio": "tritium / base over rounds", "metric": "cpu_s (whole workload)", "rounds": cpu,
                          "median": round(med, 3), "min": xs[0], "max": xs[-1]}), flush=True)
    for li, line in enumerate(runs[0][0]["lines"]):
        for key in AB_KEYS:
            ratios = [round(t["lines"][li][key] / b["lines"][li][key], 3) for t, b in runs
                      if t["lines"][li].get(key) and b["lines"][li].get(key)]
            if not ratios:
                continue
            xs = sorted(ratios)
            med = xs[len(xs) // 2] if len(xs) % 2 else (xs[len(xs) // 2 - 1] + xs[len(xs) // 2]) / 2
            print(json.dumps({"ratio": "tritium / base over rounds", "concurrency": line["concurrency"], "metric": key,
                              "rounds": ratios, "median": round(med, 3), "min": xs[0], "max": xs[-1],
                              "load_avg_1m": [[round(t["load_avg_1m"], 1), round(b["load_avg_1m"], 1)]
                                              for t, b in runs]}), flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", choices=["qwen05b", "q15b", "gemma270m", "smollm2", "code-edit"], required=True)
    ap.add_argument("--spec-type", default="ngram-simple", help="code-edit: the speculative type of both servers")
    ap.add_argument("--reps", type=int, default=2, help="code-edit: runs of its prompts per server")
    ap.add_argument("--no-warmup", dest="warmup", action="store_false", help="code-edit: no unmeasured first run")
    ap.add_argument("--n-predict", type=int, default=128, help="code-edit: tokens per request")
    ap.add_argument("--llama", default=LLAMA, help="llama-server binary")
    ap.add_argument("--tritium", default=str(Path(sys.executable).parent / "tritium-server"))
    ap.add_argument("--port", type=int, default=8100,
                    help="tritium's port; llama-server gets port + 1, --tritium-base port + 2")
    ap.add_argument("--tritium-base", metavar="CMD",
                    help="a second tritium command to compare against (e.g. 'env PYTHONPATH=OLD_TREE tritium-server')")
    ap.add_argument("--requests-per-level", type=int, help="default: the preset's")
    ap.add_argument("--no-agreement", dest="agreement", action="store_false")
    ap.add_argument("--agreement-only", action="store_true")
    ap.add_argument("--server-args", default="-np 4 -c 8192", help="flags given to both servers")
    ap.add_argument("--wait", type=float, default=600.0)
    ap.add_argument("--order", help="the servers to run now, in order (default llama,tritium; llama,base,tritium "
                                     "with --tritium-base)")
    ap.add_argument("--rounds", type=int, default=1,
                    help="with --tritium-base: run base and tritium this many times in all, alternating the order")
    ap.add_argument("--reuse", action="store_true",
                    help="take a server not run now from its saved result of an earlier run (/tmp/bench_servers-PRESET-NAME.json)")
    args = ap.parse_args()
    if args.preset == "code-edit":
        import bench_spec
        return bench_spec.main(args, model_path("qwen05b"), start, stop, wait_health, peak_rss_mib, log)
    opts = bench.resolve_options(bench.build_parser().parse_args(
        ["unused", "--preset", args.preset, "--wait", str(args.wait)]
        + (["--requests-per-level", str(args.requests_per_level)] if args.requests_per_level else [])))
    opts.agreement, opts.agreement_only, opts.wait = args.agreement, args.agreement_only, args.wait
    model = model_path(args.preset)
    flags = args.server_args.split()
    servers = {
        "tritium": ([args.tritium, "-m", model, "--port", str(args.port), *flags], f"http://127.0.0.1:{args.port}"),
        "llama": ([args.llama, "-m", model, "--port", str(args.port + 1), *flags], f"http://127.0.0.1:{args.port + 1}"),
    }
    if args.tritium_base:
        servers["base"] = ([*shlex.split(args.tritium_base), "-m", model, "--port", str(args.port + 2), *flags],
                           f"http://127.0.0.1:{args.port + 2}")
    order = (args.order or ("llama,base,tritium" if args.tritium_base else "llama,tritium")).split(",")
    if "llama" in order and not Path(args.llama).exists():
        log(f"warning: {args.llama} does not exist: tritium alone, no ratios")
        order.remove("llama")
    res = {}
    for name in order:
        cmd, url = servers[name]
        load = os.getloadavg()[0]
        res[name] = run_server(name, cmd, url, opts)
        res[name]["cmd"] = cmd
        res[name]["time"] = time.strftime("%Y-%m-%dT%H:%M:%S")
        res[name]["load_avg_1m"] = load
        Path(f"/tmp/bench_servers-{args.preset}-{name}.json").write_text(json.dumps(res[name]))
        for line in res[name]["lines"]:
            print(json.dumps(line), flush=True)
        print(json.dumps({"server": name, "peak_rss_mib": res[name]["peak_rss_mib"],
                          "load_s": round(res[name]["load_s"], 2), "cpu_s": res[name]["cpu_s"]}), flush=True)
    for name in servers:
        saved = Path(f"/tmp/bench_servers-{args.preset}-{name}.json")
        if name not in res and args.reuse and saved.exists():
            res[name] = json.loads(saved.read_text())
            log(f"{name}: the saved result of {res[name]['time']} ({' '.join(res[name]['cmd'])})")
    if args.tritium_base and args.rounds > 1 and "tritium" in res and "base" in res:
        ab_rounds(res, servers, opts, args.rounds)
    if "tritium" in res and res.get("base") and res["tritium"]["tokens"] is not None \
            and res["base"]["tokens"] is not None:
        same_base = sum(x == y for x, y in zip(res["tritium"]["tokens"], res["base"]["tokens"]))
        print(json.dumps({"greedy_identical_to_base": same_base, "prompts": len(AGREEMENT_PROMPTS)}), flush=True)
    if "tritium" not in res or "llama" not in res:
        return 0
    t, r, o = res["tritium"], res["llama"], res.get("base")
    if o is not None:
        for a, b in zip(t["lines"], o["lines"]):
            print(json.dumps({**bench.ratio_line(a, b), "ratio": "tritium / base"}), flush=True)
    rows = []
    for i, (a, b) in enumerate(zip(t["lines"], r["lines"])):
        ratio = bench.ratio_line(a, b)
        print(json.dumps(ratio), flush=True)
        c = a["concurrency"]
        rows += [(f"{label}, c={c}", b[key], a[key], o["lines"][i][key] if o else None)
                 for label, key in (("decode tok/s per stream", "decode_tokens_per_s_median"),
                                    ("aggregate tok/s", "gen_tokens_per_s"), ("TTFT median ms", "ttft_ms_median"))]
    rows += [("peak RSS MiB", r["peak_rss_mib"], t["peak_rss_mib"], o and o["peak_rss_mib"]),
             ("load s (to /health 200)", r["load_s"], t["load_s"], o and o["load_s"])]
    if t["tokens"] is not None and r["tokens"] is not None:
        same = sum(x == y for x, y in zip(t["tokens"], r["tokens"]))
        first_diff = [next((i for i, (u, v) in enumerate(zip(x or [], y or [])) if u != v), None)
                      for x, y in zip(t["tokens"], r["tokens"])]
        print(json.dumps({"greedy_identical": same, "prompts": len(AGREEMENT_PROMPTS), "tokens": AGREEMENT_TOKENS,
                          "first_difference_at": first_diff}), flush=True)
        rows.append((f"greedy: prompts identical over {AGREEMENT_TOKENS} tokens", "", f"{same}/{len(AGREEMENT_PROMPTS)}",
                     None))
    if o is not None and t["tokens"] is not None and o["tokens"] is not None:
        rows.append(("greedy: prompts identical to base", "", f"{same_base}/{len(AGREEMENT_PROMPTS)}", None))

    def ratio(a, b) -> str:
        return f"{a / b:.2f}x" if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b else ""

    def num(x) -> str:
        return str(round(x, 2) if isinstance(x, float) else x)

    if o is None:
        log(f"\n| {args.preset} | llama-server | tritium | ratio |\n| --- | --- | --- | --- |")
    else:
        log(f"\n| {args.preset} | llama-server | tritium (base) | tritium | tritium / llama-server | tritium / base |"
            "\n| --- | --- | --- | --- | --- | --- |")
    for label, b, a, base in rows:
        if o is None:
            log(f"| {label} | {num(b)} | {num(a)} | {ratio(a, b)} |")
        else:
            log(f"| {label} | {num(b)} | {num(base) if base is not None else ''} | {num(a)} | {ratio(a, b)} | "
                f"{ratio(a, base)} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
