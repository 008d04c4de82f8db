"""Constrained decoding: GBNF parsing, JSON Schema -> GBNF, and compiled token masks.

Public surface:
  GrammarError                       bad grammar / schema (the server answers HTTP 400 with it)
  SAMPLER_INIT_FAILED                llama-server's answer to a grammar that does not parse
  parse_gbnf(text) -> Grammar        parse + lower GBNF (llama.cpp syntax)
  json_schema_to_gbnf(schema) -> str llama.cpp's JSON-schema-to-grammar conversion
  JSON_OBJECT_GBNF                   grammar for response_format {"type": "json_object"}
  Vocab(token_pieces, eog_ids)       per-model token bytes, built once
  GrammarCompiler(vocab)             engine-owned LRU cache: .compile(text) -> CompiledGrammar
  compile_grammar(text, vocab)       uncached compile
  CompiledGrammar.matcher() -> Matcher with allowed_mask(), advance(id), is_complete(), fill_mask()
"""
from .gbnf import Grammar, GrammarError, GrammarTooLarge, parse_gbnf
from .json_schema import JSON_OBJECT_GBNF, json_schema_to_gbnf
from .matcher import CompiledGrammar, GrammarCompiler, Matcher, Vocab, compile_grammar

# b1-0c1e570 answers a grammar that does not parse with this alone (400); the parser's message
# goes to the log
SAMPLER_INIT_FAILED = "Failed to initialize samplers: failed to parse grammar"

__all__ = [
    "CompiledGrammar", "Grammar", "GrammarCompiler", "GrammarError", "GrammarTooLarge", "JSON_OBJECT_GBNF", "Matcher",
    "SAMPLER_INIT_FAILED", "Vocab", "compile_grammar", "json_schema_to_gbnf", "parse_gbnf",
]
