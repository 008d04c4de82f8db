"""The app's OpenAPI document with llama-server's request bodies (FastAPI sees none: every route reads
its own JSON). `build_openapi(app)` is FastAPI's generated document (paths, methods, the slot path
parameter) with a JSON schema for each POST route's body, written from llama-server's README
(tools/server/README.md) and the typed fields of b1-0c1e570 (tools/server/server-schema.cpp,
api/params.py's HARD_LIMITS): the shapes a client may send, extra fields allowed as llama-server
ignores them. Not served over HTTP (llama-server has no /openapi.json: `openapi_url=None`); fuzzers
read it from Python (tests/test_schemathesis_victim.py).
"""
from __future__ import annotations

import copy
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

I32, I64 = 2**31 - 1, 2**63 - 1
num: dict[str, Any] = {"type": "number"}
boolean: dict[str, Any] = {"type": "boolean"}
string: dict[str, Any] = {"type": "string"}
obj: dict[str, Any] = {"type": "object"}


def integer(lo: int = -I32 - 1, hi: int = I32) -> dict[str, Any]:
    return {"type": "integer", "minimum": lo, "maximum": hi}


def array(items: dict[str, Any], **kw: Any) -> dict[str, Any]:
    return {"type": "array", "items": items, **kw}


def body(properties: dict[str, Any], *required: str) -> dict[str, Any]:
    out: dict[str, Any] = {"type": "object", "properties": properties}
    if required:
        out["required"] = list(required)
    return out


strings = {"anyOf": [string, array(string)]}
token = integer(0, I32)
# a prompt: a string, token ids and strings mixed, or several of those (/completion's README)
one_prompt = {"anyOf": [string, array({"anyOf": [token, string]}, minItems=1)]}
prompt = {"anyOf": [one_prompt, array(one_prompt, minItems=1)]}
text = {"type": "string", "minLength": 1}

SAMPLING: dict[str, Any] = {  # /completion's options (README "Options:"; server-schema.cpp's limits)
    "temperature": num, "dynatemp_range": num, "dynatemp_exponent": num, "top_k": integer(),
    "top_p": num, "min_p": num, "typical_p": num, "top_n_sigma": num, "xtc_probability": num,
    "xtc_threshold": num, "n_predict": integer(-1), "n_indent": integer(0), "n_keep": integer(-1),
    "n_cmpl": integer(1), "n_cache_reuse": integer(0), "stream": boolean,
    "stream_options": body({"include_usage": boolean}), "stop": array(string),
    "repeat_penalty": num, "repeat_last_n": integer(0), "presence_penalty": num, "frequency_penalty": num,
    "dry_multiplier": num, "dry_base": num, "dry_allowed_length": integer(0), "dry_penalty_last_n": integer(0),
    "dry_sequence_breakers": array(string, minItems=1), "mirostat": integer(0, 2), "mirostat_tau": num,
    "mirostat_eta": num, "grammar": string, "json_schema": obj, "grammar_lazy": boolean,
    "seed": integer(-1, 2**32 - 1), "ignore_eos": boolean,
    "logit_bias": {"anyOf": [array(array({"anyOf": [token, string, num, {"const": False}]}, minItems=2,
                                         maxItems=2)),
                             {"type": "object", "additionalProperties": {"anyOf": [num, {"const": False}]}}]},
    "n_probs": integer(0), "min_keep": integer(0), "t_max_predict_ms": integer(-1, I64), "id_slot": integer(-1),
    "cache_prompt": boolean, "return_tokens": boolean, "timings_per_token": boolean, "return_progress": boolean,
    "post_sampling_probs": boolean, "sse_ping_interval": integer(-1),
    "samplers": {"anyOf": [string, array({"enum": ["dry", "top_k", "typ_p", "top_p", "min_p", "xtc",
                                                   "temperature", "penalties", "top_n_sigma", "infill"]})]},
    "lora": array(body({"id": integer(0), "scale": num}, "id", "scale")),
    "response_fields": array(string), "reasoning_format": {"enum": ["none", "auto", "deepseek", "deepseek-legacy"]},
}

# (image_url parts need a multimodal projector, --mmproj: this document describes a text model's server)
part = body({"type": {"const": "text"}, "text": string}, "type", "text")
tool_call = body({"id": string, "type": {"const": "function"},
                  "function": body({"name": string, "arguments": string}, "name", "arguments")}, "type", "function")
common = {"name": string, "tool_call_id": string}
message = {"anyOf": [  # every message but the assistant's has content (common/chat.cpp)
    body({"role": {"enum": ["system", "developer", "user", "tool"]}, "content": {"anyOf": [string, array(part)]},
          **common}, "role", "content"),
    *(body({"role": {"const": "assistant"}, "content": {"anyOf": [string, array(part), {"type": "null"}]},
            "tool_calls": array(tool_call, minItems=1), "reasoning_content": string, **common}, "role", need)
      for need in ("content", "tool_calls"))]}  # an assistant's: content or tool calls
function_tool = body({"type": {"const": "function"},
                      "function": body({"name": string, "description": string, "parameters": obj,
                                        "strict": boolean}, "name")}, "type", "function")
response_format = {"anyOf": [body({"type": {"enum": ["text", "json_object"]}, "schema": obj}, "type"),
                             body({"type": {"const": "json_schema"},
                                   "json_schema": body({"name": string, "schema": obj, "strict": boolean})},
                                  "type")]}
CHAT: dict[str, Any] = {  # /v1/chat/completions (README; OpenAI's fields llama-server reads)
    "messages": array(message, minItems=1), "model": string, "tools": array(function_tool),
    "tool_choice": {"anyOf": [{"enum": ["none", "auto", "required"]},
                              body({"type": {"const": "function"}, "function": body({"name": string}, "name")})]},
    "parallel_tool_calls": boolean, "response_format": response_format, "max_tokens": integer(-1),
    "max_completion_tokens": integer(-1), "logprobs": boolean, "top_logprobs": integer(0, 20), "n": integer(1),
    "chat_template_kwargs": obj, "add_generation_prompt": boolean, "continue_final_message": boolean,
    "stop": strings, "user": string,
}
TEMPLATE = {k: CHAT[k] for k in ("messages", "tools", "tool_choice", "chat_template_kwargs",
                                 "add_generation_prompt", "continue_final_message", "response_format")}

text_block = body({"type": {"const": "text"}, "text": string}, "type", "text")
block = {"anyOf": [text_block,
                   body({"type": {"const": "tool_use"}, "id": string, "name": string, "input": obj},
                        "type", "id", "name"),
                   body({"type": {"const": "tool_result"}, "tool_use_id": string,
                         "content": {"anyOf": [string, array(text_block)]}}, "type", "tool_use_id")]}
ANTHROPIC: dict[str, Any] = {  # /v1/messages (README: the Anthropic Messages API's fields)
    "model": string, "max_tokens": integer(1),
    "messages": array(body({"role": {"enum": ["user", "assistant"]},
                            "content": {"anyOf": [string, array(block)]}}, "role", "content"), minItems=1),
    "system": {"anyOf": [string, array(text_block)]},
    "stop_sequences": array(string), "stream": boolean, "temperature": num, "top_p": num, "top_k": integer(0),
    "tools": array(body({"name": string, "description": string, "input_schema": obj}, "name", "input_schema")),
    "tool_choice": body({"type": {"enum": ["auto", "any", "tool", "none"]}, "name": string}, "type"),
    "thinking": body({"type": {"enum": ["enabled", "disabled"]}, "budget_tokens": integer(0)}, "type"),
    "metadata": obj,
}
RESPONSES: dict[str, Any] = {  # /v1/responses (README: converted to a chat request)
    "input": {"anyOf": [string, array({"anyOf": [  # the item kinds of server-chat.cpp's converter
        body({"role": {"enum": ["system", "developer", "user"]},
              "content": {"anyOf": [string, array(body({"type": {"const": "input_text"}, "text": string},
                                                       "type", "text"))]}}, "role", "content"),
        body({"role": {"const": "assistant"}, "type": {"const": "message"},
              "content": {"anyOf": [string, array(body({"type": {"enum": ["output_text", "input_text"]},
                                                        "text": string}, "type", "text"))]}}, "role", "type"),
        body({"type": {"const": "function_call"}, "call_id": string, "name": string, "arguments": string},
             "type", "call_id", "name", "arguments"),
        body({"type": {"const": "function_call_output"}, "call_id": string, "output": string},
             "type", "call_id", "output")]})]},
    "instructions": string, "model": string, "max_output_tokens": integer(-1), "stream": boolean,
    "temperature": num, "top_p": num, "tools": array(body({"type": {"const": "function"}, "name": string,
                                                           "description": string, "parameters": obj}, "type", "name")),
    "reasoning": body({"effort": {"enum": ["low", "medium", "high"]}}),
}
INFILL = {"input_prefix": string, "input_suffix": string, "prompt": string,
          "input_extra": array(body({"filename": string, "text": string}, "text"))}
embed_input = {"anyOf": [text, array({"anyOf": [text, array(token, minItems=1)]}, minItems=1)]}
EMBEDDING = {"content": embed_input, "input": embed_input, "model": string,
             "encoding_format": {"enum": ["float", "base64"]}, "embd_normalize": integer(-1)}

BODIES: dict[str, dict[str, Any]] = {
    "/completion": body({"prompt": prompt, **SAMPLING}, "prompt"),
    "/v1/completions": body({"prompt": prompt, **SAMPLING, "model": string, "max_tokens": integer(-1),
                             "logprobs": integer(0, 100), "echo": boolean, "n": integer(1), "stop": strings,
                             "user": string}, "prompt"),
    "/v1/chat/completions": body({**SAMPLING, **CHAT}, "messages"),
    "/v1/chat/completions/input_tokens": body({**SAMPLING, **CHAT}, "messages"),
    "/v1/chat/completions/control": body({"id": string, "action": {"enum": ["reasoning_end"]}}, "id", "action"),
    "/apply-template": body(TEMPLATE, "messages"),
    "/v1/responses": body(RESPONSES, "input"),
    "/v1/responses/input_tokens": body(RESPONSES, "input"),
    "/v1/messages": body(ANTHROPIC, "model", "max_tokens", "messages"),
    "/v1/messages/count_tokens": body({k: v for k, v in ANTHROPIC.items() if k != "max_tokens"}, "messages"),
    "/infill": body({**SAMPLING, **INFILL}, "input_prefix", "input_suffix"),
    "/tokenize": body({"content": string, "add_special": boolean, "parse_special": boolean,
                       "with_pieces": boolean}, "content"),
    "/detokenize": body({"tokens": array(token)}, "tokens"),
    "/embedding": {**body(EMBEDDING), "anyOf": [{"required": ["content"]}, {"required": ["input"]}]},
    "/v1/embeddings": body(EMBEDDING, "input"),
    "/rerank": body({"query": string, "documents": array(string), "texts": array(string), "top_n": integer(0),
                     "return_text": boolean, "model": string}, "query"),
    "/props": obj,  # README: "Options: None yet" (with --props: any object, nothing changes)
    # a portable subset of fs_validate_filename's names (runtime/serving/slot_files.py)
    "/slots/{id_slot}": body({"filename": {"type": "string", "pattern": "^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$"}}),
    "/lora-adapters": array(body({"id": integer(0), "scale": num}, "id", "scale")),
}
ALIASES = {"/completions": "/completion", "/chat/completions": "/v1/chat/completions", "/embeddings": "/embedding",
           "/chat/completions/input_tokens": "/v1/chat/completions/input_tokens", "/responses": "/v1/responses",
           "/responses/input_tokens": "/v1/responses/input_tokens", "/reranking": "/rerank",
           "/v1/rerank": "/rerank", "/v1/reranking": "/rerank"}
SLOT_ACTION = {"name": "action", "in": "query", "required": True,
               "schema": {"enum": ["save", "restore", "erase"]}}


def build_openapi(app: FastAPI) -> dict[str, Any]:
    """FastAPI's document of `app` with the request bodies above (built once, then cached)."""
    if app.openapi_schema:
        return app.openapi_schema
    doc = get_openapi(title="tritium (llama-server API)", version="1", routes=app.routes,
                      description="llama-server's HTTP API; request bodies from its README")
    for path, ops in doc["paths"].items():
        post = ops.get("post")
        schema = BODIES.get(ALIASES.get(path, path))
        if post is None or schema is None:
            continue
        post["requestBody"] = {"required": True, "content": {"application/json": {"schema": copy.deepcopy(schema)}}}
        if path == "/slots/{id_slot}":
            post["parameters"] = [dict(p, schema={"type": "integer", "minimum": 0}) if p["name"] == "id_slot" else p
                                  for p in post.get("parameters", []) if p["name"] != "action"] + [SLOT_ACTION]
    app.openapi_schema = doc
    return doc
