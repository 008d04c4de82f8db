"""Locust load test for a llama-server compatible endpoint (tritium or llama-server itself).

    locust -f scripts/locustfile.py --headless -u 32 -r 8 -t 60s --host http://127.0.0.1:8080

Users (weights in brackets):
  ChatUser [4]        POST /v1/chat/completions, streaming (3/4 of its requests) and not
  CompletionUser [2]  POST /completion, streaming and not
  TokenizeUser [1]    POST /tokenize

Every response is validated; a streamed response fails unless every event is valid JSON and
the stream ends properly: ``data: [DONE]`` after a chunk with a finish_reason for chat, a
chunk with ``"stop": true`` for /completion (llama-server sends [DONE] only on the OpenAI
endpoints). A streamed request's reported time covers the whole stream; its time to first
token is reported as an extra entry of type ``TTFT``.

Environment knobs (defaults suit the tiny CPU test model):
  TRITIUM_LOCUST_WAIT="1,5"       think time range in seconds between a user's requests
  TRITIUM_LOCUST_MAX_TOKENS=16    max_tokens / n_predict of each request
  TRITIUM_LOCUST_MODEL=tritium    "model" field of chat requests
  TRITIUM_API_KEY                 sent as Authorization: Bearer ... when set
"""
from __future__ import annotations

import os
import random
import sys
import time
from pathlib import Path

from locust import HttpUser, between, task

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench import WORDS  # noqa: E402
from bench_sse import CompletionStream, SSEParser, StreamError, check_chat_stream  # noqa: E402


def _wait_range() -> tuple[float, float]:
    lo, _, hi = os.environ.get("TRITIUM_LOCUST_WAIT", "1,5").partition(",")
    return float(lo), float(hi or lo)


WAIT_MIN, WAIT_MAX = _wait_range()
MAX_TOKENS = int(os.environ.get("TRITIUM_LOCUST_MAX_TOKENS", "16"))
MODEL = os.environ.get("TRITIUM_LOCUST_MODEL", "tritium")
API_KEY = os.environ.get("TRITIUM_API_KEY")

QUESTIONS = (
    "Say hi.",
    "Write hello world in Java.",
    "What is the capital of France?",
    "Explain a hash map in two sentences.",
    "Give me three names for a cat.",
    "Translate 'good morning' into German.",
)


def _sentence(rng: random.Random, n_words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n_words))


class _LlamaUser(HttpUser):
    abstract = True
    wait_time = between(WAIT_MIN, WAIT_MAX)

    def on_start(self) -> None:
        self.rng = random.Random()
        if API_KEY:
            self.client.headers["Authorization"] = f"Bearer {API_KEY}"

    def _streamed(self, path: str, name: str, body: dict, fold) -> None:
        """POST with stream=True, feed the SSE to fold(events, now); report full time + TTFT."""
        t0 = time.perf_counter()
        with self.client.post(path, json=body, name=name, stream=True,
                              catch_response=True) as resp:
            if resp.status_code != 200:
                resp.failure(f"HTTP {resp.status_code}: {resp.text[:200]}")
                return
            parser = SSEParser()
            n_bytes = 0
            t_first = None
            try:
                for chunk in resp.iter_content(chunk_size=None):
                    n_bytes += len(chunk)
                    events = parser.feed(chunk)
                    if events and t_first is None:
                        t_first = time.perf_counter()
                    fold(events)
                fold(parser.close())
                fold(None)  # end of stream
            except (StreamError, UnicodeDecodeError) as e:
                resp.failure(str(e))
                return
            except Exception as e:  # connection dropped mid-stream
                resp.failure(f"{type(e).__name__}: {e}")
                return
            finally:
                resp.request_meta["response_time"] = (time.perf_counter() - t0) * 1000.0
                resp.request_meta["response_length"] = n_bytes
            resp.success()
        if t_first is not None:
            self.environment.events.request.fire(
                request_type="TTFT", name=name, response_time=(t_first - t0) * 1000.0,
                response_length=0, exception=None, context={})


class ChatUser(_LlamaUser):
    weight = 4

    def _messages(self) -> list[dict]:
        msgs = [{"role": "user", "content": self.rng.choice(QUESTIONS)}]
        if self.rng.random() < 0.3:
            msgs.insert(0, {"role": "system", "content": "You are a terse assistant."})
        return msgs

    @task(3)
    def chat_stream(self) -> None:
        body = {"model": MODEL, "messages": self._messages(), "max_tokens": MAX_TOKENS,
                "stream": True, "temperature": self.rng.choice([0.0, 0.8])}
        events: list[str] = []

        def fold(evs):
            if evs is None:
                check_chat_stream(events)
            else:
                events.extend(evs)

        self._streamed("/v1/chat/completions", "/v1/chat/completions [stream]", body, fold)

    @task(1)
    def chat(self) -> None:
        body = {"model": MODEL, "messages": self._messages(), "max_tokens": MAX_TOKENS,
                "temperature": 0.0}
        with self.client.post("/v1/chat/completions", json=body, catch_response=True) as resp:
            try:
                obj = resp.json()
                msg = obj["choices"][0]["message"]
                n = obj["usage"]["completion_tokens"]
            except (ValueError, KeyError, IndexError, TypeError) as e:
                resp.failure(f"bad chat response ({type(e).__name__}): {resp.text[:200]}")
                return
            if resp.status_code != 200 or not isinstance(msg.get("content"), str):
                resp.failure(f"HTTP {resp.status_code}: {resp.text[:200]}")
            elif not 0 <= n <= MAX_TOKENS:
                resp.failure(f"completion_tokens {n} outside 0..{MAX_TOKENS}")
            else:
                resp.success()


class CompletionUser(_LlamaUser):
    weight = 2

    @task(1)
    def completion_stream(self) -> None:
        prompt = _sentence(self.rng, self.rng.randint(5, 60))
        body = {"prompt": prompt, "n_predict": MAX_TOKENS, "stream": True, "temperature": 0}
        st = CompletionStream()

        def fold(evs):
            if evs is None:
                if not st.stopped:
                    raise StreamError("stream ended without a chunk with stop=true")
                if st.n_gen > MAX_TOKENS:
                    raise StreamError(f"{st.n_gen} tokens > n_predict {MAX_TOKENS}")
                return
            now = time.perf_counter()
            for ev in evs:
                st.on_event(ev, now)

        self._streamed("/completion", "/completion [stream]", body, fold)

    @task(1)
    def completion(self) -> None:
        prompt = _sentence(self.rng, self.rng.randint(5, 60))
        body = {"prompt": prompt, "n_predict": MAX_TOKENS, "temperature": 0}
        with self.client.post("/completion", json=body, catch_response=True) as resp:
            try:
                obj = resp.json()
                ok = (resp.status_code == 200 and isinstance(obj["content"], str)
                      and obj["stop"] is True and 0 <= obj["tokens_predicted"] <= MAX_TOKENS)
            except (ValueError, KeyError, TypeError):
                ok = False
            if ok:
                resp.success()
            else:
                resp.failure(f"bad /completion response: HTTP {resp.status_code} {resp.text[:200]}")


class TokenizeUser(_LlamaUser):
    weight = 1

    @task
    def tokenize(self) -> None:
        text = _sentence(self.rng, self.rng.randint(1, 200))
        body = {"content": text, "with_pieces": self.rng.random() < 0.2}
        with self.client.post("/tokenize", json=body, catch_response=True) as resp:
            try:
                toks = resp.json()["tokens"]
                ids = [t["id"] if isinstance(t, dict) else t for t in toks]
                ok = resp.status_code == 200 and ids and all(isinstance(i, int) for i in ids)
            except (ValueError, KeyError, TypeError):
                ok = False
            if ok:
                resp.success()
            else:
                resp.failure(f"bad /tokenize response: HTTP {resp.status_code} {resp.text[:200]}")
