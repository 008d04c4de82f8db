"""The built-in tiny model's vocabulary: a small byte-level BPE (ChatML special tokens, the `qwen2`
pre-tokenizer, the Qwen2 ChatML template) trained deterministically with `tokenizers` on a corpus
embedded here (prose, code, JSON and a word list). `builtin_vocab()` returns its `tokenizer.*`
GGUF keys for `runtime.model.tiny_model.write_tiny_model(..., vocab="builtin")`.
"""
from __future__ import annotations

import json

from gguf import GGUFValueType

from runtime.model.gguf import KV

__all__ = ["builtin_vocab", "BUILTIN_SPECIAL_TOKENS", "QWEN2_CHAT_TEMPLATE"]

# the chat template Qwen2 vocab GGUFs carry (ChatML with a default system message)
QWEN2_CHAT_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful assistant<|im_end|>\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

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
