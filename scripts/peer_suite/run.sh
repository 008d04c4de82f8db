#!/usr/bin/env bash
# llama.cpp's own server tests (tools/server/tests of b1-0c1e570, from the llama-cpp-python 0.3.36 sdist on the
# package index, MIT code fetched at run time, never kept in this repository) against a llama-server-compatible
# binary, with a tiny random model (make_model.py: the lesson's shape, the qwen2 vocabulary shipped in the same
# sdist, fixed seed) in place of the suite's downloaded stories260K, and for the vision tests' tinygemma3 the same
# model with a tiny random Gemma 3 projector (make_mmproj.py, --mmproj). Same as ../shared/peer-suite/run.sh, but
# self-contained (CI has no ../shared) and it exits 1 when a baseline test fails.
#
#   scripts/peer_suite/run.sh BIN [pytest args...]      e.g. scripts/peer_suite/run.sh .venv/bin/tritium-server -x unit/test_metrics.py
#   scripts/peer_suite/run.sh BIN --compare [BASELINE]  runs the tests a baseline names (default baseline.txt: the 102
#                                                       tests llama-server b1-0c1e570 passes) and fails if any fails
# Works under $WORK (default $TMPDIR/peer-suite); PORT (default 8080) is the port the suite's servers use.
set -eu
BIN=$(realpath "$1"); shift
HERE=$(cd "$(dirname "$0")" && pwd)
BASE=$HERE/baseline.txt
if [ "${1:-}" = "--compare" ] && [ -n "${2:-}" ]; then BASE=$(realpath "$2"); fi
WORK=${WORK:-${TMPDIR:-/tmp}/peer-suite}; mkdir -p "$WORK"; cd "$WORK"
SDIST=llama_cpp_python-0.3.36
SRC=$SDIST/vendor/llama.cpp/tools/server/tests
if [ ! -d $SRC ]; then python3 -m pip download -q --no-deps --no-binary :all: llama-cpp-python==0.3.36 -d . && tar xzf $SDIST.tar.gz; fi
if [ ! -x venv/bin/python ]; then python3 -m venv venv && venv/bin/pip -q install -r $SRC/requirements.txt gguf numpy; fi
MODEL=$WORK/tiny-qwen2-f32.gguf
[ -f $MODEL ] || venv/bin/python "$HERE/make_model.py" $SDIST/vendor/llama.cpp/models/ggml-vocab-qwen2.gguf $MODEL > /dev/null
MMPROJ=$WORK/tiny-gemma3-mmproj-f16.gguf  # the vision tests' projector, on the same text model
[ -f $MMPROJ ] || venv/bin/python "$HERE/make_mmproj.py" $MMPROJ > /dev/null
rm -rf suite && cp -r $SRC suite && cd suite
# the router tests' models, offline: the tiny model under their names in llama.cpp's Hugging Face cache layout
# (utils.py sets LLAMA_CACHE=tmp), which a router started without -m lists and loads
C=0123456789abcdef0123456789abcdef01234567
for rf in ggml-org/tinygemma3-GGUF/tinygemma3-Q8_0.gguf ggml-org/test-model-stories260K/stories260K-F32.gguf \
          ggml-org/test-model-stories260K-infill/stories260K-infill-F32.gguf; do
  repo=${rf%/*}; d=tmp/models--${repo//\//--}
  mkdir -p $d/refs $d/snapshots/$C && echo $C > $d/refs/main && ln -s "$MODEL" $d/snapshots/$C/${rf##*/}
done
venv=../venv/bin/python
$venv - <<'PY'
p = "utils.py"; s = open(p).read()
s = s.replace('server.model_hf_repo = "ggml-org/test-model-stories260K"', 'server.model_hf_repo = None\n        server.model_file = os.environ["SUITE_MODEL"]')
s = s.replace("    def load_all() -> None:", "    def load_all() -> None:\n        return")
# the vision tests' tinygemma3: the suite's model with make_mmproj.py's projector (--mmproj)
s = s.replace('server.model_hf_repo = "ggml-org/tinygemma3-GGUF:Q8_0"',
              'server.model_hf_repo = None\n        server.model_file = os.environ["SUITE_MODEL"]\n'
              '        server.mmproj_file = os.environ["SUITE_MMPROJ"]')
s = s.replace('        if self.mmproj_url:\n', '        if getattr(self, "mmproj_file", None):\n'
              '            server_args.extend(["--mmproj", self.mmproj_file])\n        if self.mmproj_url:\n')
open(p, "w").write(s)
PY
export SUITE_MODEL=$MODEL SUITE_MMPROJ=$MMPROJ LLAMA_SERVER_BIN_PATH=$BIN
if [ "${1:-}" = "--compare" ]; then
  # exactly the baseline's tests (not the others of their files, which llama-server fails too): a third of the time
  mapfile -t IDS < <(sed 's/^PASSED //' "$BASE")
  $venv -m pytest -q -p no:cacheprovider -rA "${IDS[@]}" > ../last-run.txt 2>&1 || true
  exec $venv - "$BASE" ../last-run.txt <<'PY'
import os, sys
ids = lambda f: {l.split(" ", 1)[1].strip() for l in open(f, errors="replace") if l.startswith("PASSED ")}
base, got = ids(sys.argv[1]), ids(sys.argv[2])
for t in sorted(base - got): print("FAILS", t)
print(f"{len(base & got)}/{len(base)} of the tests llama-server passes also pass here (full log: {os.path.abspath(sys.argv[2])})")
sys.exit(1 if base - got else 0)
PY
else
  exec $venv -m pytest -q -p no:cacheprovider "$@"
fi
