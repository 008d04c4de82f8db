"""tritium-server's command line against llama-server b1-0c1e570's own table.

tests/data/llama_server_args.json is common/arg.cpp's table (scripts/extract_llama_args.py, from
the llama.cpp sources of the llama-cpp-python 0.3.36 sdist): every option llama-server registers,
its spellings, value kind, hints and environment variable. tritium's parser (api/cli_args.py) must
know each spelling as the same option, parse it as llama-server parses it, and honour each
LLAMA_ARG_* variable as the flag.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from api.cli_args import OPTIONS, ArgError, Exit, build_parser, by_spelling, refusal
from api.cli_spec import Effect, Kind, Section, stof, stoi, stoul

ROOT = Path(__file__).resolve().parents[1]
TABLE = json.loads((ROOT / "tests" / "data" / "llama_server_args.json").read_text())["options"]
SERVER = [o for o in TABLE if o["server"]]


def test_the_table_is_llama_servers():
    """The extracted table has what arg.cpp registers for the server (255 options, 412 spellings)."""
    assert len(SERVER) == 255
    assert sum(len(o["args"]) + len(o["args_neg"]) for o in SERVER) == 412
    spellings = {a for o in SERVER for a in o["args"] + o["args_neg"]}
    assert {"--temperature", "-ot", "--n-cpu-moe", "--spec-type", "--models-dir", "--mmproj", "--reasoning-effort",
            "--chat-template-kwargs", "--version", "--draft", "-ctk", "--rerank"} <= spellings
    # not in b1-0c1e570's server: removed or other programs' options
    assert not {"--mlock", "--no-mmap", "-p", "--prompt", "-f", "-cnv"} & spellings


@pytest.mark.parametrize("o", SERVER, ids=lambda o: o["args"][0])
def test_every_spelling_is_the_same_option(o):
    """Every spelling llama-server knows is one of tritium's, grouped, typed and named as there."""
    known = by_spelling()
    for a in o["args"] + o["args_neg"]:
        assert a in known, f"unknown spelling {a}"
    t = known[o["args"][0]]
    assert (list(t.args), list(t.neg)) == (o["args"], o["args_neg"])
    assert t.kind.value == o["handler"]
    assert t.env == o["env"]
    assert t.hint == (o["value_hint"] if o["value_hint"] is not None or "value_hint_expr" not in o else t.hint)
    assert t.hint2 == o["value_hint_2"]


def test_no_spelling_of_tritiums_own_is_passed_off_as_llama_servers():
    spellings = {a for o in SERVER for a in o["args"] + o["args_neg"]}
    extra = {a for o in OPTIONS if o.section is not Section.TRITIUM for a in o.spellings} - spellings
    assert not extra
    own = {a for o in OPTIONS if o.section is Section.TRITIUM for a in o.spellings}
    assert own == {"-tp", "--tensor-parallel-size", "--numerics", "--max-body-size", "--header-timeout",
                   "--shutdown-timeout"} and not own & spellings


def test_effects_are_documented():
    """Every option that does nothing here says why; every pending one names what it needs; the
    README's flag table is the one these notes make (python -m api.cli_info prints it)."""
    from api.cli_info import markdown_table

    for o in OPTIONS:
        if o.effect in (Effect.NO_EFFECT, Effect.PENDING):
            assert o.note, o.args
    assert markdown_table(OPTIONS) in (ROOT / "README.md").read_text()


# ---- a value for every option ------------------------------------------------------------------

@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("cli")
    (d / "g.gbnf").write_text('root ::= "a"\n')
    (d / "s.json").write_text('{"type": "integer"}')
    (d / "ui.json").write_text('{"theme": "dark"}')
    (d / "keys").write_text("k1\n# comment\nk2\n")
    (d / "t.jinja").write_text("{{ messages[0].content }}")
    (d / "x.gguf").write_bytes(b"")
    return d


SAMPLES = {
    "-C": "3", "-Cr": "0-1", "--cpu-strict": "1", "--prio": "1", "--poll": "50", "-Cb": "3", "-Crb": "0-1",
    "--cpu-strict-batch": "1", "--prio-batch": "1", "--poll-batch": "1", "-c": "512", "-np": "2",
    "--samplers": "top_k;temperature", "-s": "42", "--sampler-seq": "kt", "--temp": "0.5", "-l": "15043+1",
    "--grammar": 'root ::= "a"', "--grammar-file": "{d}/g.gbnf", "-j": '{"type": "integer"}', "-jf": "{d}/s.json",
    "--pooling": "mean", "--rope-scaling": "linear", "-ctk": "f32", "-ctv": "f32", "-mmdev": "none",
    "-lm": "mmap", "-lzm": "off", "--numa": "distribute", "-dev": "none", "-ot": "exps=CPU", "-ngl": "99",
    "-sm": "none", "-ts": "1,1", "-fit": "on", "-fitt": "1024", "--override-kv": "a.b=int:1",
    "--lora-scaled": "{d}/x.gguf:0.5", "--control-vector-scaled": "x.gguf:1", "--host": "127.0.0.1",
    "--path": "{d}", "--ui-config": '{"a": 1}', "--ui-config-file": "{d}/ui.json", "--api-key-file": "{d}/keys",
    "--chat-template-kwargs": '{"k": [1, "x"]}', "--slot-save-path": "{d}", "--media-path": "{d}",
    "--models-dir": "{d}", "--reasoning-format": "deepseek", "-rea": "off", "--reasoning-effort": "low",
    "--reasoning-budget": "0", "--chat-template": "chatml", "--chat-template-file": "{d}/t.jinja", "-sps": "0.5",
    "--sleep-idle-seconds": "5", "--log-file": "{d}/log.txt", "--log-prompts-dir": "{d}/prompts",
    "--log-colors": "off", "-lv": "3", "--spec-draft-prio": "1", "--spec-draft-cpu-mask": "3",
    "--spec-draft-cpu-range": "0-1", "--spec-draft-cpu-mask-batch": "3", "--control-vector-layer-range": "1",
    "--spec-draft-prio-batch": "1", "--spec-draft-type-k": "q8_0", "--spec-draft-type-v": "f16",
    "--spec-draft-override-tensor": "exps=CPU", "--spec-synth-len": "2.5", "--spec-synth-rates": "0.5,0.25",
    "--spec-draft-device": "none", "--spec-draft-ngl": "all", "--spec-type": "ngram-simple,ngram-mod",
    "-tp": "1", "--numerics": "ggml", "-fa": "auto", "--video-fps": "2", "--flash-attn": "on",
}
REMOVED = {"--draft", "--draft-min", "--spec-ngram-size-n", "--spec-ngram-size-m", "--spec-ngram-min-hits", "--rpc"}


def sample_argv(o, files) -> list[str]:
    a = o.args[0]
    if o.kind in (Kind.VOID, Kind.BOOL):
        return [a]
    v = SAMPLES.get(a, "4" if o.kind is Kind.INT or o.hint in ("N", "P", "L", "SECONDS") else "x")
    v = v.replace("{d}", str(files))
    return [a, v] + (["2"] if o.kind is Kind.STR_STR else [])


PARSED = [o for o in OPTIONS if o.effect is not Effect.EXIT and o.args[0] not in REMOVED]


@pytest.mark.parametrize("o", PARSED, ids=lambda o: o.args[0])
def test_every_option_parses(o, files):
    ns = build_parser().parse_args(sample_argv(o, files), environ={})
    assert o.args[0] in ns.given


def test_removed_options_answer_as_b1():
    p = build_parser()
    for flag, msg in (("--draft", "use --spec-draft-n-max or --spec-ngram-mod-n-max"),
                      ("--draft-n-min", "use --spec-draft-n-min or --spec-ngram-mod-n-min"),
                      ("--spec-ngram-size-n", "use the respective --spec-ngram-*-size-n")):
        with pytest.raises(ArgError) as e:
            p.parse_args([flag, "8"], environ={})
        assert str(e.value).startswith(f'error while handling argument "{flag}": the argument has been removed. {msg}')
    with pytest.raises(ArgError, match='"--draft": stoi'):  # an int option: the number is read first
        p.parse_args(["--draft", "x"], environ={})
    with pytest.raises(ArgError, match='"--rpc": RPC not supported in this build'):
        p.parse_args(["--rpc", "h:1"], environ={})


@pytest.mark.parametrize("o", [o for o in PARSED if o.env], ids=lambda o: o.env)
def test_every_environment_variable_is_its_flag(o, files):
    """LLAMA_ARG_X=value parses as the flag with that value (LLAMA_ARG_NO_X as its negation)."""
    p = build_parser()
    argv = sample_argv(o, files)

    def state(ns):
        return {k: v for k, v in vars(ns).items() if k != "given" and not k.startswith("_")}
    if o.kind is Kind.VOID:
        assert state(p.parse_args([], environ={o.env: "1"})) == state(p.parse_args(argv, environ={}))
        assert state(p.parse_args([], environ={o.env: "0"})) == state(p.parse_args([], environ={}))
    elif o.kind is Kind.BOOL:
        on, off = state(p.parse_args([o.args[0]], environ={})), state(p.parse_args([o.neg[0]], environ={}))
        assert state(p.parse_args([], environ={o.env: "true"})) == on
        assert state(p.parse_args([], environ={o.env: "off"})) == off
        assert state(p.parse_args([], environ={o.env.replace("LLAMA_ARG_", "LLAMA_ARG_NO_"): "1"})) == off
        with pytest.raises(ArgError, match=f'environment variable "{o.env}": invalid boolean value'):
            p.parse_args([], environ={o.env: "maybe"})
    else:
        assert state(p.parse_args([], environ={o.env: argv[1]})) == state(p.parse_args(argv, environ={}))


def test_the_command_line_overrides_the_environment(capsys):
    ns = build_parser().parse_args(["--port", "9000"], environ={"LLAMA_ARG_PORT": "8000", "LLAMA_ARG_CTX_SIZE": "99"})
    assert (ns.port, ns.ctx_size) == (9000, 99)
    assert ("warn: LLAMA_ARG_PORT environment variable is set, but will be overwritten by command line argument "
            "--port\n") in capsys.readouterr().err
    with pytest.raises(ArgError) as e:
        build_parser().parse_args([], environ={"LLAMA_ARG_PORT": "x"})
    assert str(e.value) == 'error while handling environment variable "LLAMA_ARG_PORT": stoi\n\n'


# ---- llama-server's parsing rules ----------------------------------------------------------------

def test_spellings_and_errors_as_llama_server(capsys):
    p = build_parser()
    assert p.parse_args(["--n_predict", "5", "--cache_ram", "0"], environ={}).n_predict == 5  # "--a_b" is "--a-b"
    for argv, text in (
            (["--temp=0.5"], "error: invalid argument: --temp=0.5"),  # no "=" form
            (["--mlock"], "error: invalid argument: --mlock"),  # removed in b1-0c1e570
            (["--ctx"], "error: invalid argument: --ctx"),  # no abbreviations
            (["-m"], 'error while handling argument "-m": expected value for argument'),
            (["--port", "x"], 'error while handling argument "--port": stoi'),
            (["--top-p", "x"], 'error while handling argument "--top-p": stof'),
            (["-np", "0"], 'error while handling argument "-np": error: invalid value for n_parallel\n'),
            (["-fa", "yes"], "error while handling argument \"-fa\": error: unknown value for --flash-attn: 'yes'\n"),
            (["--repeat-last-n", "-1"], 'error while handling argument "--repeat-last-n": error: invalid repeat-last-n = -1\n'),
            (["--repeat-penalty", "0"], "error: repeat-penalty must be finite and greater than 0\n"),
            (["-ctk", "q9"], 'error while handling argument "-ctk": Unsupported cache type: q9'),
            (["--pooling", "max"], 'error while handling argument "--pooling": invalid value'),
            (["--reasoning-format", "x"], 'error while handling argument "--reasoning-format": Unknown reasoning format: x'),
            (["--spec-type", "ngram"], 'error while handling argument "--spec-type": unknown speculative type: ngram'),
            (["-ot", "exps"], 'error while handling argument "-ot": invalid value'),
            (["-ot", "exps=GPU0"], 'error while handling argument "-ot": unknown buffer type'),
            (["--n-cpu-moe", "-1"], 'error while handling argument "--n-cpu-moe": invalid value'),
            (["--chat-template-kwargs", "{x"], 'error while handling argument "--chat-template-kwargs": '
                                               "[json.exception.parse_error.101] parse error at line 1, column 2"),
            (["--slot-save-path", "/nonexistent/dir"], '"--slot-save-path": not a directory: /nonexistent/dir'),
            (["-C", "0xg"], 'error while handling argument "-C": invalid cpumask'),
            (["--sleep-idle-seconds", "0"], "invalid value: cannot be 0 or less than -1"),
            (["--host", " , "], "--host requires at least one address"),
    ):
        with pytest.raises(ArgError) as e:
            p.parse_args(argv, environ={})
        assert text in str(e.value), (argv, str(e.value))
        if str(e.value).startswith("error while handling argument"):  # then the option's usage, as llama-server
            assert str(e.value).endswith("\n\nto show complete usage, run with -h") and "\n\nusage:\n" in str(e.value)


def test_libstdcxx_conversions():
    assert (stoi(" 12abc"), stoi("-7"), stoi("+3")) == (12, -7, 3)
    assert stof("0.5x") == 0.5 and stof("inf") == float("inf") and stof("0x1p3") == 8.0
    assert stoul("-1") == (1 << 64) - 1  # strtoul wraps: -s -1 is the random seed
    for bad, f in (("x", stoi), ("99999999999", stoi), ("", stof), ("1e99", stof), ("1e-50", stof)):
        with pytest.raises(Exception):
            f(bad)


def test_values_reach_the_namespace(files):
    p = build_parser()
    ns = p.parse_args(["--temperature", "-1", "-l", "15043+1", "-l", "11-2.5", "--dry-sequence-breaker", "a",
                       "--dry-sequence-breaker", "b", "--lora", f'"{files}/a,b.gguf",c.gguf', "-a", "x, y",
                       "-a", "z", "--api-key-file", f"{files}/keys", "--api-key", "k3", "--rope-scale", "4",
                       "--reasoning", "off", "--reasoning-effort", "high", "--no-reasoning-preserve",
                       "--chat-template-kwargs", '{"a":1}', "-C", "0x5", "-Cr", "8-9"], environ={})
    assert ns.temp == 0.0  # clamped at 0
    assert ns.logit_bias == [(15043, 1.0), (11, -2.5)]
    assert ns.dry_sequence_breakers == ["a", "b"]
    assert ns.lora == [(f"{files}/a,b.gguf", 1.0), ("c.gguf", 1.0)]  # parse_csv_row: quotes group
    assert ns.alias == "x,y,z" and ns.api_keys == ["k1", "k2", "k3"]
    assert ns.rope_freq_scale == 0.25
    assert ns.template_kwargs == {"enable_thinking": "false", "reasoning_effort": '"high"',
                                  "preserve_reasoning": "false", "a": "1"}
    assert ns.cpu_set == {0, 2, 8, 9}
    assert p.parse_args(["--reasoning-effort", "low", "--reasoning-effort", "default"],
                        environ={}).template_kwargs == {}


def test_startup_refusals_name_what_is_missing():
    p = build_parser()
    for argv, text in ((["--control-vector", "x.gguf"], "control vectors are not supported yet"),
                       (["--adaptive-target", "0.5"], "adaptive-p")):
        r = refusal(p.parse_args(argv, environ={}))
        assert r is not None and text in str(r), argv
        assert str(r).startswith('error while handling argument "')
    for argv in (["-ctk", "f32"], ["-ctk", "q8_0", "-ctv", "q4_0"], ["-ctv", "iq4_nl"], ["--context-shift"], ["--no-context-shift"], ["--models-max", "2"], ["--adaptive-target", "-1"],
                 ["--mmproj", "m.gguf"], ["--models-dir", "."], ["--models-preset", "p.ini"],
                 ["--vision-gemma-4b-default"]):
        assert refusal(p.parse_args(argv, environ={})) is None, argv


def test_help_version_and_friends(capsys):
    p = build_parser()
    with pytest.raises(Exit) as e:
        p.parse_args(["--help"], environ={})
    assert e.value.code == 0
    for o in OPTIONS:  # --help lists every spelling
        for a in o.spellings:
            assert a in e.value.stdout, a
    assert "[tritium: accepted, no effect:" in e.value.stdout and "----- tritium params -----" in e.value.stdout
    with pytest.raises(Exit) as e:
        p.parse_args(["--version", "--bogus"], environ={})  # printed while parsing, as llama-server
    assert e.value.stderr.startswith("version: ") and "(build 1, commit tritium)" in e.value.stderr
    with pytest.raises(Exit) as e:
        p.parse_args(["--completion-bash"], environ={})
    assert "complete -F _llama_completions tritium-server" in e.value.stdout and " --spec-type " in e.value.stdout
    with pytest.raises(Exit) as e:
        p.parse_args(["--list-devices"], environ={})
    assert e.value.stdout.startswith("Available devices:\n")


def test_the_cli_exits_as_llama_server():
    def run(*argv):
        return subprocess.run([sys.executable, "-m", "api.cli", *argv], capture_output=True, text=True, timeout=60,
                              cwd=str(ROOT))
    r = run("--version")
    assert r.returncode == 0 and r.stderr.startswith("version: ") and r.stdout == ""
    r = run("--temperature", "0.7", "--bogus")
    assert r.returncode == 1 and r.stderr == "error: invalid argument: --bogus\n"
    r = run("-ctk", "q3_0")
    assert r.returncode == 1 and r.stderr.startswith('error while handling argument "-ctk": Unsupported cache type: q3_0')
    r = run("-h")
    assert r.returncode == 0 and "--chat-template-kwargs" in r.stdout
