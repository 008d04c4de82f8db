"""What api/ may call on the engine, as `typing.Protocol`s.

The engine (runtime/engine.py `Engine`) satisfies `EngineAPI` structurally; api/ never imports it
(the CLI does, to build one) and never touches tensors: everything crossing this line is token
ids, `runtime.tasks` dataclasses, dicts and lists. `tests/test_api_inprocess.py` checks that a
loaded `Engine` still has every member listed here.
"""
from __future__ import annotations

from typing import Any, AsyncIterator, Iterable, Mapping, Protocol, Union, runtime_checkable

from runtime.tasks import CompletionResult, CompletionTask, EmbeddingTask, TaskError, TokenOut

# What a task's `events()` yields: TokenOut while generating, then exactly one final event
# (a CompletionResult, the pooled vectors of an EmbeddingTask, or a TaskError).
Event = Union[TokenOut, CompletionResult, TaskError, list]


class TokenizerAPI(Protocol):
    """The tokenizer members the request mapping uses (runtime/tokenizer.py `Tokenizer`)."""
    @property
    def n_vocab(self) -> int: ...

    @property
    def bos_id(self) -> int | None: ...

    @property
    def eos_id(self) -> int | None: ...

    @property
    def add_bos(self) -> bool: ...

    @property
    def fim_ids(self) -> dict[str, int]:
        """Fill-in-the-middle tokens: pre, suf, mid, rep, sep (-1: missing)."""
        ...

    def encode(self, text: str, add_special: bool = False, parse_special: bool = False) -> list[int]: ...

    def decode(self, ids: Iterable[int], special: bool = True, remove_leading_space: bool | None = None) -> str: ...

    def piece(self, tid: int, special: bool = True) -> bytes: ...


class ChatTemplateAPI(Protocol):
    """The chat template (runtime/chat/template.py `ChatTemplate`), used by api/chat.py and /props."""
    @property
    def source(self) -> str: ...

    @property
    def caps(self) -> dict[str, bool]: ...

    def render(self, messages: list[dict], add_generation_prompt: bool = True, **kwargs: Any) -> str: ...

    def generation_prompt(self, messages: list[dict], **kwargs: Any) -> str: ...

    def format(self, has_tools: bool = False, tool_choice: str = "auto", has_json_schema: bool = False,
               jinja: bool = True) -> str: ...


class TaskHandleAPI(Protocol):
    """A submitted task."""

    def events(self) -> AsyncIterator[Event]: ...

    def cancel(self) -> None: ...


class EngineSettings(Protocol):
    """The engine settings api/ reads (`EngineConfig`)."""

    @property
    def n_batch(self) -> int: ...


@runtime_checkable
class EngineAPI(Protocol):
    """Exactly what api/ calls on the engine. Blocking calls (`slot_action`, `metrics`) wait for
    a step boundary of the engine thread: the routes run them with `asyncio.to_thread`."""

    @property
    def cfg(self) -> EngineSettings: ...

    @property
    def tokenizer(self) -> TokenizerAPI: ...

    @property
    def chat_template(self) -> ChatTemplateAPI: ...

    @property
    def model_info(self) -> Mapping[str, Any]: ...

    @property
    def n_slots(self) -> int: ...

    @property
    def n_ctx_slot(self) -> int: ...

    @property
    def sleeping(self) -> bool:
        """--sleep-idle-seconds: the model is released until `wake()`."""
        ...

    def wake(self) -> None:
        """Blocking: load the model again if it sleeps (run with `asyncio.to_thread`)."""
        ...

    def submit(self, task: CompletionTask | EmbeddingTask) -> TaskHandleAPI: ...

    @property
    def modalities(self) -> dict[str, bool]:
        """/props `modalities`: {"vision": ..., "audio": ...} of the --mmproj file (both False without)."""
        ...

    def tokenize_media(self, text: str, files: list[bytes], marker: str) -> Any:
        """Thread-safe (run it off the event loop): a prompt with `marker`s and one file (bytes) per
        marker -> `runtime.vision.MediaPrompt` (`tokens`, `chunks` for CompletionTask.media);
        raises `runtime.vision.MediaError` (the request's fault) or ValueError without --mmproj."""
        ...

    def idle_slot_available(self) -> bool: ...

    def slots_info(self) -> list[dict[str, Any]]:
        """One dict per slot; a slot that ran a task has `task` (the task object) and `next_token`."""
        ...

    def slot_action(self, id_slot: int, action: str, filename: str | None = None) -> dict[str, Any]:
        """save / restore / erase; raises `runtime.serving.SlotError(code, message, type)`."""
        ...

    def metrics(self) -> dict[str, float]: ...

    def control(self, cmpl_id: str, action: str) -> dict[str, Any]:
        """POST /v1/chat/completions/control: {"success": bool[, "message": str]}."""
        ...

    def lora_adapters(self) -> list[dict[str, Any]]:
        """GET /lora-adapters: [{id, path, scale, task_name, prompt_prefix}]."""
        ...

    def set_lora(self, scales: dict[int, float]) -> None:
        """POST /lora-adapters: the server's adapter scales (unlisted adapters: 0)."""
        ...

    def stop(self) -> None:
        """Called by the CLI at exit."""
        ...
