"""Lesson examples that need a server started with other flags: Example 10 (--cache-reuse),
13 (tool calls with the Qwen 2.5 template), 14 (reasoning with the DeepSeek R1 template) and 16
(--embeddings). Each class owns one server (the lesson's tiny model), stopped after the class.
"""
from __future__ import annotations

import json
import math

import httpx
import pytest

PRE = ("You are a careful Java reviewer. Read the code, list each bug with its line number, and suggest a fix. "
       "Keep answers short.")


@pytest.fixture(scope="class")
def server(request, start_server, lesson_model, shared_dir):
    args = [a.replace("{shared}", str(shared_dir)) for a in request.cls.ARGS]
    s = start_server("-m", str(lesson_model), "-a", "tiny-coder", *args)
    with httpx.Client(base_url=s.url, timeout=120) as c:
        yield c
    s.stop()


class TestEx10CacheReuse:
    ARGS = ["-np", "1", "--cache-ram", "0", "--cache-reuse", "8"]

    def test_chunk_removed_from_the_front(self, server):
        def run(prompt, **kw):
            d = server.post("/completion", json={"prompt": prompt, "n_predict": 2, **kw}).json()
            return d["tokens_evaluated"], d["timings"]["cache_n"], d["timings"]["prompt_n"]

        with_header, without = f"File: Main.java\n{PRE} Question: int x = 1/0;", f"{PRE} Question: int x = 1/0;"
        # per request n_cache_reuse 0 behaves like server A of the lesson (no --cache-reuse)
        assert run(with_header, n_cache_reuse=0) == (43, 0, 43)
        assert run(without, n_cache_reuse=0) == (38, 0, 38)
        # server B: the 37 shifted tokens are reused, only the last one is processed
        assert run(with_header) == (43, 0, 43)
        assert run(without) == (38, 37, 1)


class TestEx13ToolCalls:
    ARGS = ["--jinja", "--chat-template-file", "{shared}/templates/Qwen-Qwen2.5-7B-Instruct.jinja"]
    BODY = {
        "model": "tiny-coder",
        "messages": [{"role": "user", "content": "Show me pom.xml"},
                     {"role": "assistant", "content": "<tool_call>\n"}],
        "tools": [{"type": "function", "function": {
            "name": "read_file", "description": "Read a file from the workspace",
            "parameters": {"type": "object",
                           "properties": {"path": {"type": "string", "enum": ["pom.xml", "src/Main.java"]}},
                           "required": ["path"]}}}],
        "tool_choice": "required", "parallel_tool_calls": False,
        "logit_bias": {"151645": 100, "522": 100},
        "temperature": 0, "max_tokens": 200,
    }

    def test_props_caps(self, server):
        caps = server.get("/props").json()["chat_template_caps"]
        assert caps["supports_tools"] is True and caps["supports_tool_calls"] is True

    def test_tool_call(self, server):
        r = server.post("/v1/chat/completions", json=self.BODY)
        assert r.status_code == 200, r.text
        d = r.json()
        c = d["choices"][0]
        assert c["finish_reason"] == "tool_calls"
        msg = c["message"]
        assert msg["role"] == "assistant" and msg["content"] == ""
        (call,) = msg["tool_calls"]
        assert call["type"] == "function" and call["function"]["name"] == "read_file"
        assert len(call["id"]) == 32 and call["id"].isalnum()
        assert json.loads(call["function"]["arguments"])["path"] in ("pom.xml", "src/Main.java")
        assert d["usage"]["prompt_tokens"] == 193

    def test_tool_call_streamed(self, server):
        with server.stream("POST", "/v1/chat/completions", json={**self.BODY, "stream": True}) as r:
            events = [ln[6:] for ln in r.iter_lines() if ln.startswith("data: ")]
        assert events[-1] == "[DONE]"
        chunks = [json.loads(e) for e in events[:-1]]
        deltas = [c["choices"][0]["delta"] for c in chunks]
        calls = [d["tool_calls"][0] for d in deltas if "tool_calls" in d]
        first = calls[0]
        assert first["index"] == 0 and first["type"] == "function" and first["function"]["name"] == "read_file"
        assert len(first["id"]) == 32
        assert all(set(c) == {"index", "function"} and set(c["function"]) == {"arguments"} for c in calls[1:])
        args = "".join(c["function"]["arguments"] for c in calls)
        assert json.loads(args)["path"] in ("pom.xml", "src/Main.java")
        assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"

    def test_tool_result_rendering(self, server):
        p = server.post("/apply-template", json={"messages": [
            {"role": "user", "content": "Show me pom.xml"},
            {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function", "function": {
                "name": "read_file", "arguments": "{\"path\": \"pom.xml\"}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "<project>...</project>"}]}).json()["prompt"]
        assert p.endswith('<|im_start|>assistant\n<tool_call>\n{"name": "read_file", "arguments": {"path": "pom.xml"}}'
                          "\n</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\n<project>...</project>\n"
                          "</tool_response><|im_end|>\n<|im_start|>assistant\n")


class TestEx14Reasoning:
    ARGS = ["--jinja", "--chat-template-file", "{shared}/templates/deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja"]
    MSG = {"messages": [{"role": "user", "content": "Is 7 prime?"}], "temperature": 0, "max_tokens": 12}

    def test_template(self, server):
        assert server.post("/apply-template", json={"messages": self.MSG["messages"]}).json() == {
            "prompt": "<|endoftext|><｜User｜>Is 7 prime?<｜Assistant｜><think>\n"}

    def test_reasoning_split_and_none(self, server):
        c = server.post("/v1/chat/completions", json=self.MSG).json()["choices"][0]
        assert c["finish_reason"] == "length"
        # the model never wrote </think> in 12 tokens: everything is reasoning
        assert c["message"]["content"] == "" and c["message"]["reasoning_content"].startswith("\n")
        c2 = server.post("/v1/chat/completions", json={**self.MSG, "reasoning_format": "none"}).json()["choices"][0]
        assert "reasoning_content" not in c2["message"]
        assert c2["message"]["content"].startswith("<think>\n")

    def test_reasoning_streamed(self, server):
        with server.stream("POST", "/v1/chat/completions", json={**self.MSG, "stream": True}) as r:
            events = [ln[6:] for ln in r.iter_lines() if ln.startswith("data: ")]
        deltas = [json.loads(e)["choices"][0]["delta"] for e in events[:-1]]
        assert any("reasoning_content" in d for d in deltas)
        assert not any(d.get("content") for d in deltas)


class TestEx16Embeddings:
    ARGS = ["--embeddings", "--pooling", "mean", "-np", "1"]

    def test_openai_embeddings(self, server):
        r = server.post("/v1/embeddings", json={"input": ["public class Main", "fn main()"], "model": "tiny-coder"})
        assert r.status_code == 200, r.text
        d = r.json()
        assert (d["model"], d["object"]) == ("tiny-coder", "list")
        assert d["usage"] == {"prompt_tokens": 6, "total_tokens": 6}
        assert [e["index"] for e in d["data"]] == [0, 1] and all(e["object"] == "embedding" for e in d["data"])
        for e in d["data"]:
            assert len(e["embedding"]) == 256
            assert math.sqrt(sum(x * x for x in e["embedding"])) == pytest.approx(1.0, abs=1e-4)

    def test_native_embeddings_and_completions(self, server):
        d = server.post("/embeddings", json={"content": "public class Main"}).json()
        assert len(d) == 1 and d[0]["index"] == 0 and len(d[0]["embedding"]) == 1 and len(d[0]["embedding"][0]) == 256
        # b1-0c1e570 still generates with --embeddings (asked the same with --pooling mean: 200)
        r = server.post("/completion", json={"prompt": "x", "n_predict": 2})
        assert r.status_code == 200 and r.json()["tokens_predicted"] == 2
