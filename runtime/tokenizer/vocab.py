"""llama.cpp's vocabulary constants (`src/llama-vocab.cpp`, `include/llama.h`), shared by the
Tokenizer and its builders: vocab types, token types and attribute bits, the special-token texts
llama.cpp recognises, the GPT-2 byte <-> unicode mapping, and the token pieces."""
from __future__ import annotations

from collections.abc import Sequence
from types import MappingProxyType

# llama_vocab_type
VOCAB_TYPE_NONE = 0
VOCAB_TYPE_SPM = 1
VOCAB_TYPE_BPE = 2
VOCAB_TYPE_WPM = 3
VOCAB_TYPE_UGM = 4

# llama_token_type (the values stored in tokenizer.ggml.token_type)
TOKEN_TYPE_UNDEFINED = 0
TOKEN_TYPE_NORMAL = 1
TOKEN_TYPE_UNKNOWN = 2
TOKEN_TYPE_CONTROL = 3
TOKEN_TYPE_USER_DEFINED = 4
TOKEN_TYPE_UNUSED = 5
TOKEN_TYPE_BYTE = 6

# llama_token_attr bits
ATTR_UNDEFINED = 0
ATTR_UNKNOWN = 1 << 0
ATTR_UNUSED = 1 << 1
ATTR_NORMAL = 1 << 2
ATTR_CONTROL = 1 << 3
ATTR_USER_DEFINED = 1 << 4
ATTR_BYTE = 1 << 5
ATTR_NORMALIZED = 1 << 6
ATTR_LSTRIP = 1 << 7
ATTR_RSTRIP = 1 << 8
ATTR_SINGLE_WORD = 1 << 9
ATTR_SPECIAL = ATTR_CONTROL | ATTR_USER_DEFINED | ATTR_UNKNOWN  # rendered as their text

TYPE_TO_ATTR = MappingProxyType({
    TOKEN_TYPE_UNKNOWN: ATTR_UNKNOWN,
    TOKEN_TYPE_UNUSED: ATTR_UNUSED,
    TOKEN_TYPE_NORMAL: ATTR_NORMAL,
    TOKEN_TYPE_CONTROL: ATTR_CONTROL,
    TOKEN_TYPE_USER_DEFINED: ATTR_USER_DEFINED,
    TOKEN_TYPE_BYTE: ATTR_BYTE,
    TOKEN_TYPE_UNDEFINED: ATTR_UNDEFINED,
})

SPACE_ESC = "\u2581"  # SentencePiece's escaped space

# Texts llama.cpp treats as end of generation (llama_vocab::impl::load, special_eog_ids).
EOG_TEXTS = frozenset([
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
    "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
    "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
    "<\uff5cend\u2581of\u2581sentence\uff5c>", "[e~[",
])
# Texts llama.cpp auto-detects as the EOT token when tokenizer.ggml.eot_token_id is absent.
EOT_TEXTS = ("<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
             "<|end_of_text|>", "<EOT>", "_<EOT>", "[EOT]", "<\uff5cend\u2581of\u2581sentence\uff5c>",
             "<end_of_utterance>")
FIM_EOG_TEXTS = frozenset({  # fim pad / repo / sep tokens are EOG too
    "<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]",
    "<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>",
    "<|file_sep|>",
})
# Fill-in-the-middle tokens: GGUF key suffix -> texts llama.cpp auto-detects when the key is absent.
FIM_TEXTS = MappingProxyType({
    "pre": ("<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>", "\u2581<PRE>"),
    "suf": ("<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>", "\u2581<SUF>"),
    "mid": ("<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>", "\u2581<MID>"),
    "pad": ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>"),
    "rep": ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"),
    "sep": ("<|file_sep|>", "<file_sep>", "<fim-sep>", "<fim_sep>"),
})


def attr_to_type(a: int) -> int:
    """The llama_token_type an attribute set reports (control first, as llama.cpp)."""
    for bit, t in ((ATTR_CONTROL, TOKEN_TYPE_CONTROL), (ATTR_USER_DEFINED, TOKEN_TYPE_USER_DEFINED),
                   (ATTR_BYTE, TOKEN_TYPE_BYTE), (ATTR_UNKNOWN, TOKEN_TYPE_UNKNOWN),
                   (ATTR_UNUSED, TOKEN_TYPE_UNUSED), (ATTR_NORMAL, TOKEN_TYPE_NORMAL)):
        if a & bit:
            return t
    return TOKEN_TYPE_UNDEFINED


# ---------------------------------------------------------------------------------------------
# GPT-2 byte <-> unicode mapping
# ---------------------------------------------------------------------------------------------

def _bytes_to_unicode() -> dict[int, str]:
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("\xa1"), ord("\xac") + 1)) \
        + list(range(ord("\xae"), ord("\xff") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


# str.translate table: byte-level char -> the latin-1 char of its byte (read-only)
_UNICODE_TO_LATIN1 = MappingProxyType({ord(c): chr(b) for b, c in _bytes_to_unicode().items()})


def byte_level_decode(text: str) -> bytes:
    """llama_decode_text: byte-level unicode chars back to bytes."""
    mapped = text.translate(_UNICODE_TO_LATIN1)
    try:
        return mapped.encode("latin-1")
    except UnicodeEncodeError:
        out = bytearray()
        for ch in text:
            b = _UNICODE_TO_LATIN1.get(ord(ch))
            if b is not None:
                out.append(ord(b))
            else:  # llama.cpp renders chars outside the byte alphabet this way
                out += b"[UNK_BYTE_0x" + ch.encode("utf-8").hex().encode() + text.encode("utf-8") + b"]"
        return bytes(out)


def _byte_level_pieces(texts: Sequence[bytes], attrs: Sequence[int]) -> list[bytes] | None:
    """`token_pieces` of a byte-level vocabulary, its normal tokens decoded in whole-vocabulary
    passes (one join, translate and encode instead of 150k calls; ~0.17 s less at start-up). None
    when a text holds a char outside the byte alphabet (the per-token path renders those) or a
    byte token occurs."""
    normal = [not a & ATTR_SPECIAL and bool(a & ATTR_NORMAL) for a in attrs]
    if any(a & ATTR_BYTE and not a & (ATTR_SPECIAL | ATTR_NORMAL) for a in attrs):
        return None
    joined = b"\n".join(t for t, n in zip(texts, normal) if n).decode("utf-8", errors="replace")
    parts = joined.split("\n")  # "\n" is outside the byte alphabet: a separator, or a text to render
    if len(parts) != sum(normal):
        return None
    try:
        flat = joined.translate(_UNICODE_TO_LATIN1).encode("latin-1")  # one char -> one byte
    except UnicodeEncodeError:
        return None
    out: list[bytes] = []
    pos = 0
    it = iter(parts)
    for t, a, n in zip(texts, attrs, normal):
        if n:
            k = len(next(it))
            out.append(flat[pos:pos + k])
            pos += k + 1
        else:
            out.append(t if a & ATTR_SPECIAL else b"")
    return out


def token_pieces(texts: Sequence[bytes], attrs: Sequence[int], vocab_type: int) -> list[bytes]:
    """token_to_piece(id, special=True) of every token: special tokens as their text, normal ones
    byte-level decoded (BPE) or with U+2581 as a space (others), byte tokens `<0xXX>` as the byte,
    the rest (unused, undefined) empty."""
    byte_level = vocab_type == VOCAB_TYPE_BPE
    esc = SPACE_ESC.encode("utf-8")
    if byte_level:
        fast = _byte_level_pieces(texts, attrs)
        if fast is not None:
            return fast
    pieces = []
    for t, a in zip(texts, attrs):
        if a & ATTR_SPECIAL:
            pieces.append(t)
        elif a & ATTR_NORMAL:
            pieces.append(byte_level_decode(t.decode("utf-8", errors="replace")) if byte_level
                          else t.replace(esc, b" "))
        elif a & ATTR_BYTE:
            pieces.append(bytes([int(t[3:5], 16)]))
        else:
            pieces.append(b"")
    return pieces
