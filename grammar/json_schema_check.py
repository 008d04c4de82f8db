"""Validation of a JSON schema as llama.cpp b1-0c1e570 validates it before converting it.

A port of the checks of `common_chat_schema_from_json` (common/json-schema.cpp, class
`common_chat_schema_builder`): the same keywords looked at in the same order, each refusal a
`JsonSchemaError` with llama's exact text "JSON schema error at <path>: <msg>" (paths such as
"#", "#/type/1", "#/properties/a", "#/anyOf", "#/items"; the target of a `$ref` is checked once,
at the path of the reference itself, e.g. "#/$defs/a"). Only the checks are ported: the grammar
is still built by `grammar.json_schema`.

Values are as decoded from JSON (dict, list, str, int, float, bool, None); as in nlohmann::json a
bool is not a number, and an int outside [-2**63, 2**64) is not an integer (it parses as a double).

The walk is iterative (an explicit stack of pending nodes and after-children checks, run in the
order llama's recursion runs them), and a schema nested more than `MAX_SCHEMA_DEPTH` levels deep
(counting each followed `$ref`) is refused with `SchemaTooDeep` before anything else recurses on it.

Public: `check_json_schema(schema)`, `JsonSchemaError`, `SchemaTooDeep`, `MAX_SCHEMA_DEPTH`; for the converter `resolve_ref(root, ref,
path)` (llama's lookup of a "#/..." reference) and `as_int32(v)` (a count as llama reads it).
"""
from __future__ import annotations

from typing import Any

from .gbnf import GrammarError, GrammarTooLarge

MAX_SCHEMA_DEPTH = 128  # schemas inside schemas (a followed $ref counts as one level); tritium's own bound
_U64 = 1 << 64
_SPACES = " \t\n\v\f\r"
_UUID_FORMATS = {"uuid", "uuid1", "uuid2", "uuid3", "uuid4", "uuid5"}
_KNOWN_FORMATS = {"date", "time", "date-time"} | _UUID_FORMATS


class JsonSchemaError(GrammarError):
    """A schema llama-server refuses: "JSON schema error at <path>: <msg>"."""

    def __init__(self, path: str, msg: str):
        super().__init__(f"JSON schema error at {path}: {msg}")
        self.path, self.msg = path, msg


class SchemaTooDeep(GrammarTooLarge):
    """A schema nested past MAX_SCHEMA_DEPTH (llama.cpp has no such bound, hence no message)."""

    def __init__(self, path: str):
        shown = path if len(path) <= 200 else path[:200] + "..."
        super().__init__(f"JSON schema nests too deeply: more than {MAX_SCHEMA_DEPTH} levels of schemas inside "
                         f"schemas (at {shown}), the limit is {MAX_SCHEMA_DEPTH} (MAX_SCHEMA_DEPTH)")


def check_json_schema(schema: Any) -> None:
    """Raise JsonSchemaError where llama.cpp's schema builder throws (the first failure it meets);
    a schema nested more than MAX_SCHEMA_DEPTH levels deep raises SchemaTooDeep."""
    _Checker(schema).run(schema)


# --- nlohmann::json predicates --------------------------------------------------------------------
def _is_int(v: Any) -> bool:  # is_number_integer()
    return type(v) is int and -(1 << 63) <= v < _U64


def _is_number(v: Any) -> bool:  # is_number() (an int beyond 64 bits is a double there)
    return type(v) in (int, float)


def as_int32(v: int) -> int:  # get<int>() of an integer: a static_cast, the low 32 bits
    return ((v & 0xFFFFFFFF) ^ 0x80000000) - 0x80000000


def _stoull(sel: str) -> int | None:
    """std::stoull(sel): None where it throws (no digits, or out of range)."""
    s = sel.lstrip(_SPACES)
    neg = s[:1] == "-"
    if s and s[0] in "+-":
        s = s[1:]
    digits = s[:len(s) - len(s.lstrip("0123456789"))]
    if not digits or len(digits.lstrip("0")) > 20:
        return None
    v = int(digits.lstrip("0") or "0")
    if v >= _U64:
        return None
    return (_U64 - v) % _U64 if neg else v


def _fail(path: str, msg: str) -> None:
    raise JsonSchemaError(path, msg)


def _count(schema: dict, key: str, path: str) -> None:  # get_count
    if key in schema:
        v = schema[key]
        if not _is_int(v) or as_int32(v) < 0:
            _fail(path, f"{key} must be a non-negative integer")


def _bound(schema: dict, key: str, path: str) -> None:  # get_bound
    if not _is_number(schema[key]):
        _fail(path, f"{key} must be a number")


def _has_format(schema: dict, path: str) -> bool:  # get_format(...) != FORMAT_NONE
    if "format" not in schema:
        return False
    fmt = schema["format"]
    if not isinstance(fmt, str):
        _fail(path, "format must be a string")
    return fmt in _KNOWN_FORMATS


def resolve_ref(root: Any, ref: str, path: str) -> Any:  # resolve_ref
    target = root
    for sel in ref[1:].split("/")[1:]:
        if isinstance(target, dict) and sel in target:
            target = target[sel]
        elif isinstance(target, list):
            idx = _stoull(sel)
            if idx is None or idx >= len(target):
                _fail(path, f"cannot resolve $ref {ref}, {sel} is out of range")
            target = target[idx]
        else:
            _fail(path, f"cannot resolve $ref {ref}, {sel} not found")
    return target


# A task of the walk: (schema, path) to check as a node one level deeper, or a callable (a check
# llama runs after the children, such as an array's minItems).
_Task = Any


class _Checker:
    def __init__(self, root: Any):
        self.root = root
        self.refs: set[str] = set()  # each $ref is followed once (which also stops a cycle)

    def run(self, schema: Any) -> None:
        stack: list[tuple[_Task, int]] = [((schema, "#"), 1)]
        while stack:
            task, depth = stack.pop()
            if callable(task):
                task()
                continue
            sub, path = task
            if depth > MAX_SCHEMA_DEPTH:
                raise SchemaTooDeep(path)
            children = self.node(sub, path) or []
            stack.extend((c, depth + 1) for c in reversed(children))

    def node(self, schema: Any, path: str) -> list[_Task] | None:  # build_node: checks, then the children
        if not isinstance(schema, dict):
            _fail(path, "schema must be an object")
        if "$ref" in schema:
            return self.ref(schema["$ref"], path)
        if "oneOf" in schema or "anyOf" in schema:
            key = "oneOf" if "oneOf" in schema else "anyOf"
            return self.alternatives(schema[key], f"{path}/{key}")
        typ = schema.get("type")
        if isinstance(typ, list):
            # {"type": ["a", "b"], ...} is {"anyOf": [{"type": "a", ...}, {"type": "b", ...}]}
            if not typ:
                _fail(path, "type must not be empty")
            return [({**schema, "type": t}, f"{path}/type/{i}") for i, t in enumerate(typ)]
        if "const" in schema:
            return None
        if "enum" in schema:
            values = schema["enum"]
            if not isinstance(values, list) or not values:
                _fail(path, "enum must be a non-empty array")
            return None
        if typ is not None and not isinstance(typ, str):
            _fail(path, "type must be a string or an array of strings")

        type_name = typ or ""
        has_properties = "properties" in schema or (
            "additionalProperties" in schema and schema["additionalProperties"] is not True)
        if not type_name:
            # without a type the structural keywords decide
            if has_properties:
                return self.object(schema, path)
            if "allOf" in schema:
                return self.alternatives(schema["allOf"], f"{path}/allOf")
            if "items" in schema or "prefixItems" in schema:
                return self.array(schema, path)
            if any(k in schema for k in ("pattern", "minLength", "maxLength")) or _has_format(schema, path):
                return self.string(schema, path)
            return None
        if type_name == "object":
            if not has_properties and "allOf" in schema:
                return self.alternatives(schema["allOf"], f"{path}/allOf")
            return self.object(schema, path)
        if type_name == "string":
            if "allOf" in schema:
                return self.alternatives(schema["allOf"], f"{path}/allOf")
            return self.string(schema, path)
        if type_name == "array":
            return self.array(schema, path)
        if type_name == "integer":
            return self.integer(schema, path)
        if type_name in ("number", "boolean", "null"):
            return None
        _fail(path, f"unrecognized type {type_name}")

    def ref(self, ref: Any, path: str) -> list[_Task] | None:  # build_ref
        if not isinstance(ref, str):
            _fail(path, "$ref must be a string")
        if not ref.startswith("#/"):
            _fail(path, f"unsupported $ref {ref}, only references into the same document are supported")
        if ref not in self.refs:
            self.refs.add(ref)
            return [(resolve_ref(self.root, ref, path), ref)]
        return None

    def alternatives(self, alts: Any, path: str) -> list[_Task]:  # build_alternatives
        if not isinstance(alts, list):
            _fail(path, "must be an array of schemas")
        if not alts:
            _fail(path, "must not be empty")
        return [(alt, f"{path}/{i}") for i, alt in enumerate(alts)]

    def object(self, schema: dict, path: str) -> list[_Task]:  # build_object ("required" is only read)
        tasks: list[_Task] = []
        if "properties" in schema:
            properties = schema["properties"]
            if not isinstance(properties, dict):
                _fail(path, "properties must be an object")
            tasks.extend((prop, f"{path}/properties/{name}") for name, prop in properties.items())
        if "additionalProperties" in schema:
            additional = schema["additionalProperties"]
            if isinstance(additional, dict):
                tasks.append((additional, f"{path}/additionalProperties"))
            elif not isinstance(additional, bool):  # checked after the properties' subtrees, as in llama
                tasks.append(lambda: _fail(path, "additionalProperties must be a boolean or a schema"))
        return tasks

    def array(self, schema: dict, path: str) -> list[_Task]:  # build_array
        if "items" in schema or "prefixItems" in schema:
            key = "items" if "items" in schema else "prefixItems"  # "items" wins
            items = schema[key]
            if isinstance(items, list):  # a tuple: minItems / maxItems are not read
                return [(item, f"{path}/{key}/{i}") for i, item in enumerate(items)]
            return [(items, f"{path}/{key}"), lambda: self.counts(schema, path)]
        self.counts(schema, path)
        return []

    @staticmethod
    def counts(schema: dict, path: str) -> None:
        _count(schema, "minItems", path)
        _count(schema, "maxItems", path)

    def string(self, schema: dict, path: str) -> None:  # build_string
        if "pattern" in schema and not isinstance(schema["pattern"], str):
            _fail(path, "pattern must be a string")
        _has_format(schema, path)
        _count(schema, "minLength", path)
        _count(schema, "maxLength", path)

    def integer(self, schema: dict, path: str) -> None:  # build_integer: the first bound of each side
        for keys in (("minimum", "exclusiveMinimum"), ("maximum", "exclusiveMaximum")):
            key = next((k for k in keys if k in schema), None)
            if key is not None:
                _bound(schema, key, path)
