"""The serving room: the engine thread, its scheduler, the slots and the model runner.

See docs/DESIGN.md (Engine) for the contract with `api/`; each module's docstring says what it owns.
"""
from runtime.serving.config import EngineConfig
from runtime.serving.engine import Engine
from runtime.serving.handle import TaskHandle
from runtime.serving.slot_files import SlotError, valid_slot_filename

__all__ = ["Engine", "EngineConfig", "TaskHandle", "SlotError", "valid_slot_filename"]
