"""JSON Schema -> GBNF with llama.cpp's semantics and rule names.

Reimplements the behaviour of llama.cpp's `json_schema_to_grammar` (common/json-schema-to-grammar
and examples/json_schema_to_grammar.py): the same rule names (`root`, `space`, `char`, `<prop>-kv`,
...), the same whitespace rule, digit-range rules for integer bounds, `char{m,n}` for string
lengths, regex `pattern` translation, string formats, `$ref`/`$defs` (recursion allowed),
anyOf/oneOf/allOf, enum/const, tuples and arrays with min/max items.

A schema is first validated as llama.cpp validates it (`json_schema_check`, its exact messages).

Public: `json_schema_to_gbnf(schema: dict) -> str`; `JSON_OBJECT_GBNF` for
response_format {"type": "json_object"} (any JSON object).
"""
from __future__ import annotations

import json
import re
from typing import Any

from .gbnf import GrammarError
from .int_range import IntRange, int_bound
from .json_schema_check import MAX_SCHEMA_DEPTH, SchemaTooDeep, as_int32, check_json_schema, resolve_ref
from .schema_pattern import pattern_rule, repeat_text

_I64 = 1 << 63
SPACE_RULE = '| " " | "\\n"{1,2} [ \\t]{0,20}'

# name -> (body, dependencies)
_PRIMITIVES: dict[str, tuple[str, list[str]]] = {
    "boolean": ('("true" | "false")', []),
    "decimal-part": ("[0-9]{1,16}", []),
    "integral-part": ("[0] | [1-9] [0-9]{0,15}", []),
    "number": ('("-"? integral-part) ("." decimal-part)? ([eE] [-+]? integral-part)?',
               ["integral-part", "decimal-part"]),
    "integer": ('("-"? integral-part)', ["integral-part"]),
    "value": ("object | array | string | number | boolean | null",
              ["object", "array", "string", "number", "boolean", "null"]),
    "object": ('"{" space ( string ":" space value ("," space string ":" space value)* )? space "}"',
               ["string", "value"]),
    "array": ('"[" space ( value ("," space value)* )? space "]"', ["value"]),
    "uuid": ('"\\"" [0-9a-fA-F]{8} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{4} "-" '
             '[0-9a-fA-F]{12} "\\""', []),
    "char": ('[^"\\\\\\x7F\\x00-\\x1F] | [\\\\] (["\\\\bfnrt] | "u" [0-9a-fA-F]{4})', []),
    "string": ('"\\"" char* "\\""', ["char"]),
    "null": ('"null"', []),
}

_FORMATS: dict[str, tuple[str, list[str]]] = {
    "date": ('[0-9]{4} "-" ( "0" [1-9] | "1" [0-2] ) "-" ( "0" [1-9] | [1-2] [0-9] | "3" [0-1] )', []),
    "time": ('([01] [0-9] | "2" [0-3]) ":" [0-5] [0-9] ":" [0-5] [0-9] ( "." [0-9]{3} )? '
             '( "Z" | ( "+" | "-" ) ( [01] [0-9] | "2" [0-3] ) ":" [0-5] [0-9] )', []),
    "date-time": ('date "T" time', ["date", "time"]),
    "date-string": ('"\\"" date "\\""', ["date"]),
    "time-string": ('"\\"" time "\\""', ["time"]),
    "date-time-string": ('"\\"" date-time "\\""', ["date-time"]),
}

_RESERVED = {"root", "dot", *_PRIMITIVES, *_FORMATS}
# rules every schema names alike (a grammar of several schemas shares them)
SHARED_RULES = frozenset({"space", "dot", *_PRIMITIVES, *_FORMATS})
_BAD_NAME_CHARS = re.compile(r"[^a-zA-Z0-9-]+")
_LITERAL_ESCAPES = {"\r": "\\r", "\n": "\\n", '"': '\\"', "\\": "\\\\"}


def _literal(s: str) -> str:
    return '"' + "".join(_LITERAL_ESCAPES.get(c, c) for c in s) + '"'


def _const(value: Any) -> str:
    return _literal(json.dumps(value))


class _Converter:
    def __init__(self, root: Any) -> None:
        self.rules: dict[str, str] = {"space": SPACE_RULE}
        self.root = root
        self.refs: dict[str, Any] = {}
        self.resolving: set[str] = set()
        self.depth = 0  # schemas being visited, one inside the other (at most MAX_SCHEMA_DEPTH)

    # --- rule table ---------------------------------------------------------------------------
    def add_rule(self, name: str, body: str) -> str:
        key = _BAD_NAME_CHARS.sub("-", name)
        if key in self.rules and self.rules[key] != body:
            i = 0
            while f"{key}{i}" in self.rules and self.rules[f"{key}{i}"] != body:
                i += 1
            key = f"{key}{i}"
        self.rules[key] = body
        return key

    def add_primitive(self, name: str, prim: tuple[str, list[str]]) -> str:
        key = self.add_rule(name, prim[0])
        for dep in prim[1]:
            if dep not in self.rules:
                self.add_primitive(dep, _PRIMITIVES.get(dep) or _FORMATS[dep])
        return key

    def format(self) -> str:
        return "".join(f"{k} ::= {v}\n" for k, v in sorted(self.rules.items()))  # each line ends, as llama.cpp's

    # --- $ref ---------------------------------------------------------------------------------
    def target(self, ref: Any) -> Any:
        """What a $ref points at, looked up as llama.cpp looks it up (json_schema_check.resolve_ref),
        and only when the schema uses it (an unused definition is never read)."""
        if not isinstance(ref, str) or not ref.startswith("#/"):
            raise GrammarError(f"unsupported $ref {ref}")
        if ref not in self.refs:
            self.refs[ref] = resolve_ref(self.root, ref, "#")
        return self.refs[ref]

    def resolve_ref(self, ref: str) -> str:
        name = "ref" + _BAD_NAME_CHARS.sub("-", ref.split("#")[-1])
        if name not in self.rules and ref not in self.resolving:
            self.resolving.add(ref)
            name = self.visit(self.target(ref), name)
            self.resolving.discard(ref)
        return name

    # --- schema nodes -------------------------------------------------------------------------
    def union(self, name: str, alts: list[Any]) -> str:
        return " | ".join(self.visit(s, f"{name}{'-' if name else 'alternative-'}{i}") for i, s in enumerate(alts))

    def visit(self, schema: Any, name: str) -> str:
        """The rule for `schema`. Recursive, but at most MAX_SCHEMA_DEPTH schemas deep (a few Python
        frames each): check_json_schema refused deeper schemas already; this guard covers the ways
        the converter walks that the check does not (a $ref first met deeper, allOf components)."""
        if self.depth >= MAX_SCHEMA_DEPTH:
            raise SchemaTooDeep(name or "#")
        self.depth += 1
        try:
            return self.visit_node(schema, name)
        finally:
            self.depth -= 1

    def visit_node(self, schema: Any, name: str) -> str:
        if schema is True:
            schema = {}
        if not isinstance(schema, dict):
            raise GrammarError(f"unrecognized schema: {json.dumps(schema)}")
        typ = schema.get("type") or None  # "type": "" is no type, as in llama.cpp
        fmt = schema.get("format")
        rule_name = name + "-" if name in _RESERVED else (name or "root")

        if "$ref" in schema:
            return self.add_rule(rule_name, self.resolve_ref(schema["$ref"]))
        if "oneOf" in schema or "anyOf" in schema:
            return self.add_rule(rule_name, self.union(name, schema.get("oneOf") or schema["anyOf"]))
        if isinstance(typ, list):
            return self.add_rule(rule_name, self.union(name, [{**schema, "type": t} for t in typ]))
        if "const" in schema:
            return self.add_rule(rule_name, _const(schema["const"]))
        if "enum" in schema:
            return self.add_rule(rule_name, "(" + " | ".join(_const(v) for v in schema["enum"]) + ")")
        if typ in (None, "object") and ("properties" in schema or (
                "additionalProperties" in schema and schema["additionalProperties"] is not True)):
            props = list(schema.get("properties", {}).items())
            required = schema.get("required")  # llama.cpp reads the strings of an array, nothing else
            required = {r for r in required if isinstance(r, str)} if isinstance(required, list) else set()
            return self.add_rule(rule_name, self.object_rule(props, required, name, schema.get("additionalProperties")))
        if typ in (None, "object", "string") and "allOf" in schema:
            return self.all_of(schema, name, rule_name)
        if typ in (None, "array") and ("items" in schema or "prefixItems" in schema):
            items = schema.get("items", schema.get("prefixItems"))
            sep = "-" if name else ""
            if isinstance(items, list):
                parts = ' "," space '.join(self.visit(it, f"{name}{sep}tuple-{i}") for i, it in enumerate(items))
                return self.add_rule(rule_name, f'"[" space {parts} space "]"')
            item = self.visit(items, f"{name}{sep}item")
            rep = repeat_text(item, as_int32(schema.get("minItems", 0)),
                              None if "maxItems" not in schema else as_int32(schema["maxItems"]), sep='"," space')
            return self.add_rule(rule_name, f'"[" space {rep} space "]"')
        if typ in (None, "string") and "pattern" in schema:
            return pattern_rule(self, schema["pattern"], rule_name)
        if typ in (None, "string") and re.fullmatch(r"uuid[1-5]?", fmt or ""):
            return self.add_primitive("root" if rule_name == "root" else fmt, _PRIMITIVES["uuid"])
        if typ in (None, "string") and f"{fmt}-string" in _FORMATS:
            prim = f"{fmt}-string"
            return self.add_rule(rule_name, self.add_primitive(prim, _FORMATS[prim]))
        if typ == "string" and ("minLength" in schema or "maxLength" in schema):
            char = self.add_primitive("char", _PRIMITIVES["char"])
            hi = schema.get("maxLength")
            rep = repeat_text(char, as_int32(schema.get("minLength", 0)), None if hi is None else as_int32(hi))
            return self.add_rule(rule_name, f'"\\"" {rep} "\\""')
        if typ == "integer" and (bounds := _int_bounds(schema)) != (None, None):  # untyped: bounds mean nothing
            lo, hi = bounds
            if lo is not None and hi is not None and lo > hi:
                raise GrammarError(f"integer range [{lo}, {hi}] is empty")
            r = IntRange()
            r.build(lo, hi)
            return self.add_rule(rule_name, "(" + "".join(r.out) + ")")
        if typ == "object" or len(schema) == 0:
            return self.add_rule(rule_name, self.add_primitive("object", _PRIMITIVES["object"]))
        if typ is None:
            return self.add_rule(rule_name, self.add_primitive("value", _PRIMITIVES["value"]))
        if typ not in _PRIMITIVES:
            raise GrammarError(f"unrecognized schema: {json.dumps(schema)}")
        return self.add_primitive("root" if rule_name == "root" else typ, _PRIMITIVES[typ])

    def all_of(self, schema: dict, name: str, rule_name: str) -> str:
        required: set[str] = set()
        props: list[tuple[str, Any]] = []
        enum_sets: list[list[Any]] = []

        def add(comp: dict, is_required: bool) -> None:
            if "$ref" in comp:
                comp = self.target(comp["$ref"])
            for k, v in comp.get("properties", {}).items():
                props.append((k, v))
                if is_required:
                    required.add(k)
            if "enum" in comp:
                enum_sets.append(list(comp["enum"]))

        for comp in schema["allOf"]:
            if "anyOf" in comp:
                for sub in comp["anyOf"]:
                    add(sub, False)
            else:
                add(comp, True)
        if enum_sets:
            common = [v for v in enum_sets[0] if all(v in s for s in enum_sets[1:])]
            if common:
                try:
                    common = sorted(common)
                except TypeError:
                    pass
                return self.add_rule(rule_name, "(" + " | ".join(_const(v) for v in common) + ")")
        return self.add_rule(rule_name, self.object_rule(props, required, name, None))

    def object_rule(self, props: list[tuple[str, Any]], required: set[str], name: str, additional: Any) -> str:
        sep = "-" if name else ""
        kv: dict[str, str] = {}
        for prop, sub in props:
            value_rule = self.visit(sub, f"{name}{sep}{prop}")
            kv[prop] = self.add_rule(f"{name}{sep}{prop}-kv", f"{_const(prop)} space \":\" space {value_rule}")
        names = [p for p, _ in props]
        req = [p for p in names if p in required]
        opt = [p for p in names if p not in required]
        if additional is not None and additional is not False:
            sub_name = f"{name}{sep}additional"
            value_rule = (self.visit(additional, f"{sub_name}-value") if isinstance(additional, dict)
                          else self.add_primitive("value", _PRIMITIVES["value"]))
            key_rule = (self.add_primitive("string", _PRIMITIVES["string"]) if not names
                        else self.add_rule(f"{sub_name}-k", self.not_strings(names)))
            kv["*"] = self.add_rule(f"{sub_name}-kv", f'{key_rule} ":" space {value_rule}')
            opt.append("*")

        rule = '"{" space ' + ' "," space '.join(kv[k] for k in req)
        if opt:
            rule += " ("
            if req:
                rule += ' "," space ( '

            def piece(k: str, first_optional: bool) -> str:
                comma = f'( "," space {kv[k]} )'
                if first_optional:
                    return comma + ("*" if k == "*" else "?")
                return kv[k] + (" " + comma + "*" if k == "*" else "")

            # llama's recursive chain over the optional keys, built from the last key back (no
            # recursion, each `<key>-rest` rule once, added in the order the recursion adds them):
            # rest[j] is the rule for the optional keys after opt[j]
            rest: dict[int, str] = {}
            for j in range(len(opt) - 1, 0, -1):
                body = piece(opt[j], True) + (" " + rest[j] if j in rest else "")
                rest[j - 1] = self.add_rule(f"{name}{sep}{opt[j - 1]}-rest", body)
            rule += " | ".join(piece(opt[i], False) + (" " + rest[i] if i in rest else "") for i in range(len(opt)))
            if req:
                rule += " )"
            rule += " )?"
        return rule + ' space "}"'

    def not_strings(self, strings: list[str]) -> str:
        """A JSON string that is none of `strings` (for additionalProperties keys)."""
        trie: dict = {}
        for s in strings:
            node = trie
            for c in s:
                node = node.setdefault(c, {})
            node[""] = True  # end marker
        char = self.add_primitive("char", _PRIMITIVES["char"])
        out = ['["] ( ']
        # depth-first over the trie on an explicit stack (a key's length must not be a stack depth):
        # frames [node, its sorted child characters, how many of them are done]
        stack: list[list] = [[trie, sorted(k for k in trie if k != ""), 0]]
        while stack:
            frame = stack[-1]
            node, keys, done = frame
            if done < len(keys):
                c = keys[done]
                frame[2] += 1
                if done:
                    out.append(" | ")
                out.append(f"[{c}]")
                child = node[c]
                child_keys = sorted(k for k in child if k != "")
                if child_keys:
                    out.append(" (")
                    stack.append([child, child_keys, 0])
                elif child.get(""):
                    out.append(f" {char}+")
                continue
            if keys:
                out.append(f' | [^"{"".join(keys)}] {char}*')
            stack.pop()
            if stack:
                out.append(")")
        out.append(f' ){"" if trie.get("") else "?"} ["]')
        return "".join(out)


def _wrap64(v: int) -> int:
    """v as an int64_t (two's complement wrap)."""
    return (v + _I64) % (2 * _I64) - _I64


def _int64_bound(v: Any, up: bool) -> int:
    """llama.cpp's get_bound: an integer as int64_t (wrapping), a double rounded inwards and cast
    (out of range: INT64_MIN, as x86 converts it)."""
    if isinstance(v, int) and not isinstance(v, bool) and -_I64 <= v < 2 * _I64:
        return _wrap64(v)
    try:
        d = int_bound(float(v), up)  # beyond 64 bits an integer is a double there
    except (OverflowError, ValueError):  # inf, nan
        return -_I64
    return d if -_I64 <= d < _I64 else -_I64


def _int_bounds(schema: dict) -> tuple[int | None, int | None]:
    """[lo, hi] of an integer schema as llama.cpp computes them (minimum, else exclusiveMinimum + 1;
    maximum, else exclusiveMaximum - 1; int64 arithmetic); None for an open side (INT64_MIN/MAX)."""
    lo, hi = -_I64, _I64 - 1
    if "minimum" in schema:
        lo = _int64_bound(schema["minimum"], up=True)
    elif "exclusiveMinimum" in schema:
        lo = _wrap64(_int64_bound(schema["exclusiveMinimum"], up=False) + 1)
    if "maximum" in schema:
        hi = _int64_bound(schema["maximum"], up=False)
    elif "exclusiveMaximum" in schema:
        hi = _wrap64(_int64_bound(schema["exclusiveMaximum"], up=True) - 1)
    return (None if lo == -_I64 else lo), (None if hi == _I64 - 1 else hi)


def json_schema_to_gbnf(schema: Any) -> str:
    """Convert a JSON schema (a decoded JSON value) to llama.cpp-style GBNF. Raises GrammarError:
    first a JsonSchemaError where llama.cpp's validation refuses the schema (its exact text, see
    `json_schema_check`), then the converter's own errors."""
    check_json_schema(schema)
    conv = _Converter(schema)
    try:
        conv.visit(schema, "")
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        if isinstance(e, GrammarError):
            raise
        raise GrammarError(f"unsupported JSON schema: {type(e).__name__}: {e}") from None
    return conv.format()


JSON_OBJECT_GBNF = json_schema_to_gbnf({"type": "object"})
