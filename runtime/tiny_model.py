"""Random-weight GGUF models for tests, benchmarks and the server's default model.

- `TinyModelSpec`: the shape (defaults: the lesson's model: llama, 4 layers, 256 dims, 8 heads,
  2 KV heads, FFN 704, context 4096) plus weight type and seed.
- `write_tiny_model(path, spec, vocab=None | path to a vocab-only GGUF | "builtin")` writes the
  file with `gguf.GGUFWriter`. With `/work/shared/vocab/ggml-vocab-qwen2.gguf` and `--type f32`
  it has exactly the lesson's 80,611,584 parameters and 322,446,336 bytes of tensor data.
- `builtin_vocab()`: a small byte-level BPE vocabulary (ChatML special tokens, `qwen2`
  pre-tokenizer) trained deterministically with `tokenizers` on a corpus embedded here.
- `ensure_default_model() -> Path`: the built-in model, generated once into
  `$TRITIUM_CACHE` (default `~/.cache/tritium/`).
- `quantize(x: float32 [rows, cols], qtype) -> uint8 [rows, row_bytes]`: gguf's quantizers plus
  simple Q4_K / Q6_K ones (gguf-py has none for k-quants).
"""
from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType, GGUFWriter, LlamaFileType
from gguf import quants as gquants

__all__ = [
    "TinyModelSpec", "write_tiny_model", "builtin_vocab", "vocab_from_gguf", "ensure_default_model",
    "quantize", "BUILTIN_SPEC", "QWEN2_CHAT_TEMPLATE", "WEIGHT_TYPES",
]

Q = GGMLQuantizationType
KV = tuple[str, Any, GGUFValueType, "GGUFValueType | None"]  # key, value, type, array item type

# the chat template Qwen2 vocab GGUFs carry (ChatML with a default system message)
QWEN2_CHAT_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful assistant<|im_end|>\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


@dataclass(frozen=True)
class TinyModelSpec:
    arch: str = "llama"  # llama | mistral | qwen2 | qwen3
    n_layer: int = 4
    n_embd: int = 256
    n_head: int = 8
    n_head_kv: int = 2
    n_ff: int = 704
    n_ctx: int = 4096
    head_dim: int | None = None  # None: n_embd // n_head
    rope_freq_base: float = 10000.0
    rms_eps: float = 1e-5
    wtype: str = "f32"  # one of WEIGHT_TYPES
    seed: int = 0
    init_std: float = 0.02
    name: str = "tiny-random"
    n_vocab: int = 0  # only used without a vocabulary (0: 256)
    tie_embeddings: bool = False  # True: no output.weight (the output reuses token_embd)
    random_blocks: bool = False  # quantized tensors as random GGUF blocks (fast for 8B shapes)


BUILTIN_SPEC = TinyModelSpec(n_layer=2, n_embd=128, n_head=4, n_head_kv=2, n_ff=352,
                             name="tritium-builtin-tiny", seed=1234)
_BUILTIN_VERSION = 1  # bump when the built-in vocab/spec changes (cache file name)


# ---------------------------------------------------------------------------------------------
# quantization

def _f16_bytes(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """float32 [N] -> (uint8 [N, 2] f16 bytes, the f16 value back as float32 [N])."""
    h = x.astype(np.float16)
    return h.view(np.uint8).reshape(-1, 2), h.astype(np.float32)


def _quantize_q6_k(x: np.ndarray) -> np.ndarray:
    """float32 [N, 256] -> uint8 [N, 210] (ql[128], qh[64], int8 scales[16], f16 d)."""
    n = x.shape[0]
    xs = x.reshape(n, 16, 16)
    sub = np.abs(xs).max(-1) / 31.0  # [N, 16] per sub-block step
    d_bytes, d = _f16_bytes(sub.max(-1) / 127.0)  # [N]
    with np.errstate(divide="ignore", invalid="ignore"):
        sc = np.where(d[:, None] > 0, np.round(sub / d[:, None]), 0).clip(0, 127)
        step = d[:, None] * sc  # [N, 16]
        q = np.where(step[..., None] > 0, np.round(xs / step[..., None]), 0)
    q = (q.clip(-32, 31) + 32).astype(np.uint8).reshape(n, 256)
    lo = (q & 0x0F).reshape(n, 2, 2, 64)
    ql = (lo[:, :, 0, :] | (lo[:, :, 1, :] << 4)).reshape(n, 128)
    hi = (q >> 4).reshape(n, 2, 4, 32)
    qh = (hi[:, :, 0] | (hi[:, :, 1] << 2) | (hi[:, :, 2] << 4) | (hi[:, :, 3] << 6)).reshape(n, 64)
    scales = sc.astype(np.int8).view(np.uint8)
    return np.concatenate([ql, qh, scales, d_bytes], axis=1)


def _quantize_q4_k(x: np.ndarray) -> np.ndarray:
    """float32 [N, 256] -> uint8 [N, 144] (f16 d, f16 dmin, scales[12], qs[128])."""
    n = x.shape[0]
    xs = x.reshape(n, 8, 32)
    lo = np.minimum(xs.min(-1), 0.0)  # [N, 8] (mins are subtracted, so <= 0)
    scale = (xs.max(-1) - lo) / 15.0
    mins = -lo
    d_bytes, d = _f16_bytes(scale.max(-1) / 63.0)
    m_bytes, dmin = _f16_bytes(mins.max(-1) / 63.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        sc = np.where(d[:, None] > 0, np.round(scale / d[:, None]), 0).clip(0, 63).astype(np.uint8)
        mn = np.where(dmin[:, None] > 0, np.round(mins / dmin[:, None]), 0).clip(0, 63).astype(np.uint8)
        step = d[:, None] * sc
        off = dmin[:, None] * mn
        q = np.where(step[..., None] > 0, np.round((xs + off[..., None]) / step[..., None]), 0)
    q = q.clip(0, 15).astype(np.uint8).reshape(n, 4, 2, 32)
    qs = (q[:, :, 0, :] | (q[:, :, 1, :] << 4)).reshape(n, 128)
    packed = np.empty((n, 12), dtype=np.uint8)
    packed[:, 0:4] = sc[:, :4] | ((sc[:, 4:] >> 4) << 6)
    packed[:, 4:8] = mn[:, :4] | ((mn[:, 4:] >> 4) << 6)
    packed[:, 8:12] = (sc[:, 4:] & 0x0F) | ((mn[:, 4:] & 0x0F) << 4)
    return np.concatenate([d_bytes, m_bytes, packed, qs], axis=1)


_OWN_QUANTIZERS = {Q.Q4_K: _quantize_q4_k, Q.Q6_K: _quantize_q6_k}


def quantize(x: np.ndarray, qtype: GGMLQuantizationType) -> np.ndarray:
    """float32 [rows, cols] -> the GGUF data of `qtype`: uint8 [rows, row_bytes] for quantized
    types, float16/float32 [rows, cols] for F16/F32."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    if qtype == Q.F32:
        return x
    if qtype == Q.F16:
        return x.astype(np.float16)
    fn = _OWN_QUANTIZERS.get(qtype)
    if fn is None:
        return gquants.quantize(x, qtype)
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    rows, cols = x.shape
    if cols % block_size:
        raise ValueError(f"{qtype.name}: row size {cols} is not a multiple of {block_size}")
    return fn(x.reshape(-1, block_size)).reshape(rows, cols // block_size * type_size)


# byte offsets of the f16 scale fields in one block, and the scale magnitude (times init_std)
# that gives dequantized weights of about init_std
_SCALE_FIELDS = {
    Q.Q8_0: ([0], 1 / 64), Q.Q4_0: ([0], 1 / 4), Q.Q4_1: ([0, 2], 1 / 8), Q.Q5_0: ([0], 1 / 8),
    Q.Q5_1: ([0, 2], 1 / 16), Q.Q2_K: ([80, 82], 1 / 16), Q.Q3_K: ([108], 1 / 64),
    Q.Q4_K: ([0, 2], 1 / 256), Q.Q5_K: ([0, 2], 1 / 512), Q.Q6_K: ([208], 1 / 1024),
}


def random_blocks(rows: int, cols: int, qtype: GGMLQuantizationType, rng: np.random.Generator,
                  std: float) -> np.ndarray:
    """Valid random GGUF blocks [rows, row_bytes] of `qtype` (random quants and sub-scales, small
    positive f16 scales): a real-shaped quantized model without quantizing billions of floats."""
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    n_blocks = rows * (cols // block_size)
    data = rng.integers(0, 256, size=(n_blocks, type_size), dtype=np.uint8)
    offsets, mag = _SCALE_FIELDS[qtype]
    for off in offsets:
        d = (rng.random(n_blocks, dtype=np.float32) * 0.5 + 0.75) * std * mag
        data[:, off:off + 2] = d.astype(np.float16).view(np.uint8).reshape(n_blocks, 2)
    return data.reshape(rows, cols // block_size * type_size)


# --type -> (file type, base tensor type); per-tensor choices follow llama.cpp's mixes
WEIGHT_TYPES = {
    "f32": (LlamaFileType.ALL_F32, Q.F32),
    "f16": (LlamaFileType.MOSTLY_F16, Q.F16),
    "q8_0": (LlamaFileType.MOSTLY_Q8_0, Q.Q8_0),
    "q4_0": (LlamaFileType.MOSTLY_Q4_0, Q.Q4_0),
    "q4_k": (LlamaFileType.MOSTLY_Q4_K_M, Q.Q4_K),
    "q6_k": (LlamaFileType.MOSTLY_Q6_K, Q.Q6_K),
}

# llama.cpp's fallback when a row is not a multiple of the k-quant super-block (256)
_FALLBACK = {Q.Q4_K: Q.Q5_0, Q.Q6_K: Q.Q8_0, Q.Q5_K: Q.Q5_1}


def _tensor_type(name: str, wtype: str, layer: int, n_layer: int, cols: int) -> GGMLQuantizationType:
    base = WEIGHT_TYPES[wtype][1]
    if base in (Q.F32, Q.F16):
        return base
    t = base
    if name == "output.weight" and base in (Q.Q4_0, Q.Q4_K):
        t = Q.Q6_K  # llama.cpp keeps the output matrix at Q6_K for these mixes
    elif base == Q.Q4_K and name.endswith(("attn_v.weight", "ffn_down.weight")):
        # Q4_K_M: more bits for a subset of the layers (llama.cpp's use_more_bits)
        if layer < n_layer // 8 or layer >= 7 * n_layer // 8 or (layer - n_layer // 8) % 3 == 2:
            t = Q.Q6_K
    block = GGML_QUANT_SIZES[t][0]
    if cols % block:
        t = _FALLBACK.get(t, t)
        if cols % GGML_QUANT_SIZES[t][0]:
            t = Q.F16
    return t


# ---------------------------------------------------------------------------------------------
# vocabularies

def vocab_from_gguf(path: str | Path) -> list[KV]:
    """Every `tokenizer.*` key of a GGUF file with its value type."""
    from runtime.loader import read_gguf

    gf = read_gguf(path, with_tensors=False)
    return [(k, v, *gf.value_types[k]) for k, v in gf.metadata.items() if k.startswith("tokenizer.")]


_CORPUS = r'''
The quick brown fox jumps over the lazy dog. A model that stays loaded in memory can answer
many requests from other programs. Loading a model takes seconds, so you want to do it once and
keep it ready. The server loads one model, then waits for requests. A client sends a request with
the conversation, and the server sends back the answer. Every response has a structure: the field
names, the token counts, the cache counters and the log lines.

Once upon a time there was a little robot who lived in a small house near the sea. Every morning
the robot walked to the beach, counted the waves and wrote the numbers in a notebook. One day a
seagull asked: "Why do you count the waves?" The robot answered: "Because nobody else does, and
someone should know how many there are." The seagull laughed, but the next day it came back and
helped. Together they counted more waves than anyone had ever counted before.

Language models read text as tokens. A token can be a whole word, a part of a word, a single
character or a byte. The tokenizer splits the text into pieces, and the model predicts the next
piece, one at a time. Prefill is the step where the model reads the prompt; decode is the step
where it writes the answer. The key-value cache holds what the model has already read, so it
does not read it again. When two requests share the same beginning, the server can reuse the
cached work and only process the new part of the prompt.

What is the capital of France? The capital of France is Paris. How many days are in a week?
There are seven days in a week: Monday, Tuesday, Wednesday, Thursday, Friday, Saturday and
Sunday. The months of the year are January, February, March, April, May, June, July, August,
September, October, November and December. Numbers: 0 1 2 3 4 5 6 7 8 9 10 11 12 100 1000 2024.
Hello! Hi there. Thank you very much. You are welcome. Please write a short poem about the sea.
Sure, here is a poem: the sea is wide, the sea is deep, the waves go on while people sleep.

def fibonacci(n: int) -> int:
    """Return the n-th Fibonacci number."""
    a, b = 0, 1
    for _ in range(n):
        a, b = b, a + b
    return a


class Stack:
    def __init__(self):
        self.items = []

    def push(self, item):
        self.items.append(item)

    def pop(self):
        if not self.items:
            raise IndexError("pop from empty stack")
        return self.items.pop()

    def __len__(self):
        return len(self.items)


import json
import os

def load_config(path):
    with open(path, "r", encoding="utf-8") as f:
        data = json.load(f)
    return {key: value for key, value in data.items() if value is not None}

if __name__ == "__main__":
    print(fibonacci(10))
    print(load_config(os.environ.get("CONFIG", "config.json")))

public class HelloWorld {
    public static void main(String[] args) {
        System.out.println("Hello, World!");
        for (int i = 0; i < 10; i++) {
            System.out.println("i = " + i);
        }
    }
}

function add(a, b) {
  return a + b;
}
const result = [1, 2, 3].map((x) => x * 2).filter((x) => x > 2);
console.log(JSON.stringify({ result, ok: true }));

{"name": "tiny-coder", "model": "tiny-coder", "object": "list", "data": [{"id": "1", "value": 3.14}]}
{"role": "user", "content": "What is 2 + 2?"} {"role": "assistant", "content": "2 + 2 = 4."}
SELECT id, name FROM users WHERE age > 18 ORDER BY name LIMIT 10;
curl -s http://127.0.0.1:8080/health -H "Authorization: Bearer secret"
'''

_WORDS = """
about above across action activity actually address after again against agent agree ahead
allow almost alone along already also although always among amount analysis animal another
answer anyone anything appear apply approach area argument around array arrive article artist
assume attack attention audience author available avoid away baby back bad balance ball bank
base basic battle beautiful become before begin behavior behind believe benefit best better
between beyond big bill billion bird black blood blue board body book born both boundary box
boy branch break bring brother budget buffer build building business buy cache call camera
campaign cancel candidate capacity capital card care career carry case catch cause cell center
central century certain chair challenge chance change channel chapter character charge check
child choice choose church citizen city civil claim class clear client close coach code cold
collection college color column combine come command comment common community company compare
compile complete compute computer concern condition conference connect consider constant
consumer contain context continue control convert cost could country couple course court cover
create crime cultural culture current customer cycle damage danger data daughter deal debate
debug decade decide decision declare deep default defense define degree delete deliver demand
democratic depend deploy describe design despite detail determine develop device dictionary
difference different difficult dinner direction director discover discuss disease display
distance document dream drive driver during early east easy economic economy edge education
effect effort eight either election element else employee empty encode energy engine enjoy
enough enter entire environment equal error escape especially establish evening event evidence
exactly example execute exist expect experience expert explain expression external face fact
factor fail fall family far fast father fear feature federal feel field figure file fill film
final finally financial find fine finish fire firm first fish five float floor focus follow
food foot force foreign forget form format former forward four free friend front full function
future game garden general generate generation girl give glass global goal good government
graph great green ground group grow growth guess gun hair half hand handle hang happen happy
hard hash have head health hear heart heat heavy help herself high himself history hold home
hope hospital hotel hour house however huge human hundred husband idea identify image imagine
impact import important improve include increase indeed index indicate individual industry
information initial input inside instance instead integer interest interface international
interview into invalid investment issue item itself iterate join journey judge just keep kernel
kill kind kitchen know knowledge land language large last late later laugh lawyer layer lead
leader learn least leave left legal length less letter level library life light like likely
limit line list listen little live local long look lose loss love machine magazine main
maintain major majority make manage management manager many market marriage material matrix
matter maybe measure media medical meet meeting member memory mention message method middle
might military million mind minute miss mission model modern moment money month more morning
most mother motion mouth move movement much music must myself name nation national natural
nature near nearly necessary need network never news newspaper next nice night node none
north note nothing notice number object obtain occur offer office officer official often
operation opinion option order organization other others output outside owner page pain
painting paper parameter parent parse part participant particular partner party pass past
patient pattern peace people perform performance perhaps period person personal phone physical
pick picture piece place plan plant player pointer police policy political politics poor
popular population position positive possible power practice prepare present president
pressure pretty prevent price private probably problem produce product production professional
professor program project property protect prove provide public pull purpose push quality
query question queue quickly quite race radio raise range rate rather reach read ready real
reality realize really reason receive recent recently recognize record reduce reflect region
relate relationship religious remain remember remove report represent republican require
research resource respond rest return reveal rich right rise risk road rock role room rule
runtime safe same save scene school science scientist score screen season seat second section
security seek seem sell send senior sense series serious serve service session seven several
shake share shoot short shoulder should show side sign significant similar simple simply since
sing single sister site situation size skill skin small smile social society soldier some
somebody someone something sometimes song soon sort sound source south southern space speak
special specific speech spend sport spring staff stage stand standard star start state
statement station stay step still stock stop store story strategy street string strong
student study stuff style subject success successful such suddenly suffer suggest summer
support sure surface system table take talk task teach teacher team technology television tell
template tend tensor term test than thank that their them themselves then theory there these
they thing think third those though thought thousand threat three through throughout throw thus
time today together tonight total tough toward town trade traditional training travel treat
treatment tree trial trip trouble true truth try turn type under understand unit until upon
usually validate value variable various very victim view violence visit voice vote wait walk
wall want watch water weapon wear weather week weight well west western whatever wheel where
whether which while white whole whom whose wide wife will window wish with within without
woman wonder word work worker world worry would write writer wrong yard yeah year yes yet
young yourself
"""


_QWEN2_PRE_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
BUILTIN_SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def builtin_vocab(vocab_size: int = 3000) -> list[KV]:
    """Train the built-in byte-level BPE vocabulary; returns its `tokenizer.*` GGUF keys."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(_QWEN2_PRE_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=1, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=[])
    paragraphs = [p.strip("\n") for p in _CORPUS.split("\n\n") if p.strip()]
    words = _WORDS.split()
    # every listed word as a lower-case, capitalized and upper-case word, after a space
    paragraphs += [" ".join(words), " ".join(w.capitalize() for w in words),
                   " ".join(w.upper() for w in words[::3])]
    tok.train_from_iterator(paragraphs, trainer=trainer)

    import json

    model = json.loads(tok.to_str())["model"]
    vocab: dict[str, int] = model["vocab"]
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    assert [vocab[t] for t in tokens] == list(range(len(tokens)))
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    n_normal = len(tokens)
    tokens += BUILTIN_SPECIAL_TOKENS
    token_type = [1] * n_normal + [3] * len(BUILTIN_SPECIAL_TOKENS)  # 1 normal, 3 control
    eot, im_start, im_end = range(n_normal, n_normal + 3)
    S, A, U32, I32, B = (GGUFValueType.STRING, GGUFValueType.ARRAY, GGUFValueType.UINT32,
                         GGUFValueType.INT32, GGUFValueType.BOOL)
    return [
        ("tokenizer.ggml.model", "gpt2", S, None),
        ("tokenizer.ggml.pre", "qwen2", S, None),
        ("tokenizer.ggml.tokens", tokens, A, S),
        ("tokenizer.ggml.token_type", token_type, A, I32),
        ("tokenizer.ggml.merges", merges, A, S),
        ("tokenizer.ggml.bos_token_id", eot, U32, None),
        ("tokenizer.ggml.eos_token_id", im_end, U32, None),
        ("tokenizer.ggml.eot_token_id", im_end, U32, None),
        ("tokenizer.ggml.padding_token_id", eot, U32, None),
        ("tokenizer.ggml.add_bos_token", False, B, None),
        ("tokenizer.chat_template", QWEN2_CHAT_TEMPLATE, S, None),
    ]


def _encode_str(s: Any) -> Any:
    # strings read with surrogateescape (invalid UTF-8 in the source file) go back as bytes
    if isinstance(s, str):
        try:
            s.encode("utf-8")
        except UnicodeEncodeError:
            return s.encode("utf-8", errors="surrogateescape")
    return s


# ---------------------------------------------------------------------------------------------
# writing

def _head_dim(spec: TinyModelSpec) -> int:
    return spec.head_dim or spec.n_embd // spec.n_head


def tensor_shapes(spec: TinyModelSpec, n_vocab: int) -> list[tuple[str, tuple[int, ...]]]:
    """(GGUF name, numpy shape [rows, cols] or [n]) of every tensor, in file order."""
    hd = _head_dim(spec)
    q_dim, kv_dim = spec.n_head * hd, spec.n_head_kv * hd
    out: list[tuple[str, tuple[int, ...]]] = [("token_embd.weight", (n_vocab, spec.n_embd))]
    for i in range(spec.n_layer):
        p = f"blk.{i}."
        out.append((p + "attn_norm.weight", (spec.n_embd,)))
        out.append((p + "attn_q.weight", (q_dim, spec.n_embd)))
        out.append((p + "attn_k.weight", (kv_dim, spec.n_embd)))
        out.append((p + "attn_v.weight", (kv_dim, spec.n_embd)))
        if spec.arch == "qwen2":
            out += [(p + "attn_q.bias", (q_dim,)), (p + "attn_k.bias", (kv_dim,)),
                    (p + "attn_v.bias", (kv_dim,))]
        if spec.arch == "qwen3":
            out += [(p + "attn_q_norm.weight", (hd,)), (p + "attn_k_norm.weight", (hd,))]
        out.append((p + "attn_output.weight", (spec.n_embd, q_dim)))
        out.append((p + "ffn_norm.weight", (spec.n_embd,)))
        out.append((p + "ffn_gate.weight", (spec.n_ff, spec.n_embd)))
        out.append((p + "ffn_up.weight", (spec.n_ff, spec.n_embd)))
        out.append((p + "ffn_down.weight", (spec.n_embd, spec.n_ff)))
    out.append(("output_norm.weight", (spec.n_embd,)))
    if not spec.tie_embeddings:
        out.append(("output.weight", (n_vocab, spec.n_embd)))
    return out


def write_tiny_model(path: str | Path, spec: TinyModelSpec = TinyModelSpec(),
                     vocab: str | Path | list[KV] | None = None) -> Path:
    """Write a random-weight GGUF. `vocab`: a vocab-only GGUF path (every `tokenizer.*` key is
    copied), "builtin" (see `builtin_vocab`), a list of keys, or None (no tokenizer;
    `spec.n_vocab` rows, default 256)."""
    if spec.arch not in ("llama", "mistral", "qwen2", "qwen3"):
        raise ValueError(f"unsupported arch {spec.arch!r}")
    if spec.wtype not in WEIGHT_TYPES:
        raise ValueError(f"unsupported weight type {spec.wtype!r} (one of {', '.join(WEIGHT_TYPES)})")
    if spec.n_head % spec.n_head_kv:
        raise ValueError("n_head must be a multiple of n_head_kv")
    if vocab == "builtin":
        keys = builtin_vocab()
    elif isinstance(vocab, (str, Path)):
        keys = vocab_from_gguf(vocab)
    else:
        keys = list(vocab or [])
    kv = {k: v for k, v, _, _ in keys}
    n_vocab = len(kv["tokenizer.ggml.tokens"]) if "tokenizer.ggml.tokens" in kv else (spec.n_vocab or 256)

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    ftype, _ = WEIGHT_TYPES[spec.wtype]
    hd = _head_dim(spec)
    w = GGUFWriter(str(path), spec.arch)
    w.add_name(spec.name)
    w.add_context_length(spec.n_ctx)
    w.add_embedding_length(spec.n_embd)
    w.add_block_count(spec.n_layer)
    w.add_feed_forward_length(spec.n_ff)
    w.add_head_count(spec.n_head)
    w.add_head_count_kv(spec.n_head_kv)
    w.add_rope_freq_base(spec.rope_freq_base)
    w.add_layer_norm_rms_eps(spec.rms_eps)
    w.add_rope_dimension_count(hd)
    if spec.head_dim is not None or spec.arch == "qwen3":
        w.add_key_length(hd)
        w.add_value_length(hd)
    w.add_vocab_size(n_vocab)
    w.add_file_type(int(ftype))
    if spec.wtype not in ("f32", "f16"):
        w.add_quantization_version(2)
    for key, val, vtype, itype in keys:
        if vtype == GGUFValueType.ARRAY and itype == GGUFValueType.STRING:
            val = [_encode_str(s) for s in val]
        elif vtype == GGUFValueType.STRING:
            val = _encode_str(val)
        w.add_key_value(key, val, vtype, sub_type=itype)

    rng = np.random.default_rng(spec.seed)
    for name, shape in tensor_shapes(spec, n_vocab):
        if len(shape) == 1:
            if name.endswith(".bias"):
                arr = (rng.standard_normal(shape, dtype=np.float32) * spec.init_std).astype(np.float32)
            else:
                arr = np.ones(shape, dtype=np.float32)  # norm weights
            w.add_tensor(name, arr)
            continue
        layer = int(name.split(".")[1]) if name.startswith("blk.") else -1
        qtype = _tensor_type(name, spec.wtype, layer, spec.n_layer, shape[1])
        if spec.random_blocks and qtype in _SCALE_FIELDS:
            data = random_blocks(shape[0], shape[1], qtype, rng, spec.init_std)
        else:
            x = rng.standard_normal(shape, dtype=np.float32)
            x *= spec.init_std
            data = quantize(x, qtype)
        if qtype in (Q.F32, Q.F16):
            w.add_tensor(name, data)
        else:
            w.add_tensor(name, data, raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _cache_dir() -> Path:
    env = os.environ.get("TRITIUM_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "tritium"


def ensure_default_model() -> Path:
    """Path of the built-in model (ChatML byte-level BPE vocab, 2 layers, 128 dims, f32),
    generated on first use into `$TRITIUM_CACHE` or `~/.cache/tritium/`."""
    d = _cache_dir()
    target = d / f"tritium-builtin-tiny-v{_BUILTIN_VERSION}-f32.gguf"
    if target.exists():
        return target
    d.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-builtin-", suffix=".gguf", dir=d)
    os.close(fd)
    try:
        write_tiny_model(tmp, BUILTIN_SPEC, vocab="builtin")
        os.replace(tmp, target)  # atomic: concurrent callers see a whole file or none
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target


def spec_with(**overrides: Any) -> TinyModelSpec:
    """`TinyModelSpec()` with the non-None overrides applied."""
    return replace(TinyModelSpec(), **{k: v for k, v in overrides.items() if v is not None})
