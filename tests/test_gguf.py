"""runtime.model.gguf, the one GGUF reader: values and types against gguf-py, tensor infos, and clear
errors for files that are not GGUF, truncated or malformed."""
from __future__ import annotations

import struct
from pathlib import Path

import gguf
import numpy as np
import pytest
from gguf import GGUFReader

from runtime.model.gguf import read_gguf, read_gguf_metadata, tensor_data
from runtime.model.loader import load_model
from runtime.model.tiny_model import TinyModelSpec, write_tiny_model
from runtime.tokenizer import load_tokenizer

SHARED = Path(__file__).resolve().parents[2] / "shared"
QWEN2_VOCAB = SHARED / "vocab" / "ggml-vocab-qwen2.gguf"
TINY = dict(n_layer=1, n_embd=64, n_head=2, n_head_kv=1, n_ff=128)


def _write(path: Path, fill) -> Path:
    w = gguf.GGUFWriter(str(path), "llama")
    fill(w)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_scalar_and_array_values(tmp_path):
    def fill(w):
        w.add_uint32("t.u32", 7)
        w.add_int32("t.i32", -3)
        w.add_float32("t.f32", 1.5)
        w.add_bool("t.bool", True)
        w.add_string("t.str", "héllo")
        w.add_array("t.strs", ["a", "b c", "", "\u2581x"])
        w.add_array("t.ints", [1, 2, 3])
        w.add_uint64("t.u64", 2**40)

    path = _write(tmp_path / "meta.gguf", fill)
    md = read_gguf_metadata(path)
    assert md["general.architecture"] == "llama"
    assert md["t.u32"] == 7 and md["t.i32"] == -3 and md["t.f32"] == 1.5 and md["t.bool"] is True
    assert md["t.str"] == "héllo" and md["t.u64"] == 2**40
    assert md["t.strs"] == ["a", "b c", "", "\u2581x"]
    assert md["t.ints"] == [1, 2, 3]
    r = GGUFReader(str(path))
    assert {k for k in r.fields if not k.startswith("GGUF.")} == set(md)
    gf = read_gguf(path)
    assert gf.value_types["t.strs"] == (gguf.GGUFValueType.ARRAY, gguf.GGUFValueType.STRING)
    assert gf.value_types["t.u32"] == (gguf.GGUFValueType.UINT32, None)
    assert gf.version == 3 and gf.alignment == 32 and gf.tensors == []


def test_invalid_utf8_round_trips(tmp_path):
    """Invalid UTF-8 comes back as surrogate escapes: the bytes are recoverable exactly, and the
    tokenizer keeps the token's raw text."""
    bad = b"<\xff\xfe>"

    def fill(w):
        w.add_key_value("t.bad", bad, gguf.GGUFValueType.STRING)
        w.add_key_value("tokenizer.ggml.model", "gpt2", gguf.GGUFValueType.STRING)
        w.add_key_value("tokenizer.ggml.tokens", [b"a", b"b", bad, b"ab"], gguf.GGUFValueType.ARRAY,
                        sub_type=gguf.GGUFValueType.STRING)
        w.add_key_value("tokenizer.ggml.merges", [b"a b", b"a \xff"], gguf.GGUFValueType.ARRAY,
                        sub_type=gguf.GGUFValueType.STRING)

    md = read_gguf_metadata(_write(tmp_path / "bad.gguf", fill))
    assert md["t.bad"].encode("utf-8", "surrogateescape") == bad
    assert md["tokenizer.ggml.tokens"][2].encode("utf-8", "surrogateescape") == bad
    tok = load_tokenizer(md)
    assert tok.token_text(2) == bad and tok.token_id(bad) == 2
    assert tok.encode("ab") == [3]


def test_metadata_matches_gguf_reader(tmp_path):
    path = write_tiny_model(tmp_path / "b.gguf", TinyModelSpec(**TINY), vocab="builtin")
    md = read_gguf_metadata(path)
    reader = GGUFReader(path)
    keys = [k for k in reader.fields if not k.startswith("GGUF.")]
    assert list(md) == keys
    for k in keys:
        want = reader.fields[k].contents()
        if isinstance(want, float):
            assert md[k] == pytest.approx(want)
        else:
            assert md[k] == want, k
    gf = read_gguf(path)
    assert [t.name for t in gf.tensors] == [t.name for t in reader.tensors]
    assert [t.offset for t in gf.tensors] == [int(t.data_offset) for t in reader.tensors]
    assert [t.n_bytes for t in gf.tensors] == [int(t.n_bytes) for t in reader.tensors]
    assert gf.data is None
    mapped = read_gguf(path, map_data=True)
    for info, rt in zip(mapped.tensors, reader.tensors):
        np.testing.assert_array_equal(tensor_data(mapped, info).reshape(-1).view(np.uint8),
                                      np.asarray(rt.data).reshape(-1).view(np.uint8))


def test_read_qwen2_vocab_metadata():
    if not QWEN2_VOCAB.exists():
        pytest.skip("../shared not available")
    md = read_gguf_metadata(QWEN2_VOCAB)
    assert md["general.architecture"] == "qwen2"
    assert len(md["tokenizer.ggml.tokens"]) == 151936
    assert md["tokenizer.ggml.tokens"][:3] == ["!", '"', "#"]
    assert md["tokenizer.ggml.merges"][0] == "Ġ Ġ"
    assert md["tokenizer.ggml.eos_token_id"] == 151643
    assert "You are a helpful assistant" in md["tokenizer.chat_template"]


# ---------------------------------------------------------------------------------------------
# files that are not GGUF, truncated or malformed: a ValueError in the user's terms

@pytest.fixture(scope="module")
def small_model(tmp_path_factory) -> bytes:
    path = write_tiny_model(tmp_path_factory.mktemp("m") / "m.gguf", TinyModelSpec(**TINY),
                            vocab="builtin")
    return path.read_bytes()


def _all_readers(path: Path) -> list:
    return [lambda: read_gguf(path), lambda: read_gguf_metadata(path),
            lambda: read_gguf(path, map_data=True), lambda: load_model(path, progress=print)]


def test_empty_file(tmp_path):
    path = tmp_path / "empty.gguf"
    path.write_bytes(b"")
    for read in _all_readers(path) + [lambda: load_tokenizer(path)]:
        with pytest.raises(ValueError, match=r"empty\.gguf: not a GGUF file \(the file is empty\)"):
            read()


def test_not_gguf(tmp_path):
    path = tmp_path / "bad.gguf"
    path.write_bytes(b"NOTAGGUF" + b"\0" * 64)
    for read in _all_readers(path):
        with pytest.raises(ValueError, match="not a GGUF file"):
            read()


def test_truncated_header(tmp_path, small_model):
    path = tmp_path / "h.gguf"
    path.write_bytes(small_model[:12])
    for read in _all_readers(path):
        with pytest.raises(ValueError, match=r"truncated GGUF: .*h\.gguf: the file ends inside the "
                                             r"header: expected at least 24 bytes, it has 12"):
            read()


def test_truncated_tensor_data(tmp_path, small_model):
    path = tmp_path / "t.gguf"
    path.write_bytes(small_model[:-100])
    assert read_gguf_metadata(path)["tokenizer.ggml.pre"] == "qwen2"  # the metadata is whole
    assert load_tokenizer(path).n_vocab > 0
    n = len(small_model)
    for read in (lambda: read_gguf(path), lambda: load_model(path, progress=print)):
        with pytest.raises(ValueError, match=rf"truncated GGUF: .*t\.gguf: the file ends inside the data "
                                             rf"of tensor 'output\.weight': expected at least {n} bytes, "
                                             rf"it has {n - 100}"):
            read()


def test_every_truncation_is_a_clear_value_error(tmp_path, small_model):
    """Cut anywhere in the header, the metadata or the tensor infos: always a ValueError that says
    so, never a struct.error or an IndexError."""
    path = tmp_path / "cut.gguf"
    path.write_bytes(small_model)
    data_offset = read_gguf(path).data_offset
    cuts = sorted(set(range(0, 64)) | set(range(64, data_offset, 97)) | {data_offset - 1})
    for cut in cuts:
        path.write_bytes(small_model[:cut])
        with pytest.raises(ValueError, match=r"truncated GGUF|not a GGUF file") as e:
            read_gguf(path)
        if cut >= 24:
            assert f"it has {cut} " in str(e.value)


def test_directory_as_model_path(tmp_path):
    folder = tmp_path / "models"
    folder.mkdir()
    for read in (lambda: read_gguf(folder), lambda: read_gguf_metadata(folder)):
        with pytest.raises(ValueError, match=r"models: is a directory, not a GGUF file"):
            read()
    with pytest.raises(ValueError, match=r"models: is a directory, not a GGUF file \(nor a Hugging Face"):
        load_model(folder)


def test_malformed_value_type_and_version(tmp_path):
    key = b"general.x"
    header = b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", len(key)) + key
    path = tmp_path / "vt.gguf"
    path.write_bytes(header + struct.pack("<I", 99) + b"\0" * 8)
    with pytest.raises(ValueError, match=r"malformed GGUF: .*'general\.x' has unknown value type 99"):
        read_gguf(path)
    path.write_bytes(b"GGUF" + struct.pack("<IQQ", 1, 0, 0))
    with pytest.raises(ValueError, match="unsupported GGUF version 1"):
        read_gguf(path)


def test_light_header_leaves_big_arrays_unread_and_maps_the_file(tmp_path):
    """`light_header` (what a forked start-up sends) keeps every value but its big arrays, which
    read the file on first use; `map_file` maps the data as read_gguf(map_data=True) does."""
    import pickle

    from runtime.model.gguf import UnreadArray, light_header, map_file

    path = tmp_path / "m.gguf"
    write_tiny_model(path, TinyModelSpec(n_layer=1, n_embd=64, n_head=2, n_head_kv=2, n_ff=128), vocab="builtin")
    full = read_gguf(path)
    light = pickle.loads(pickle.dumps(light_header(full, path, min_items=100)))
    unread = {k for k, v in light.metadata.items() if isinstance(v, UnreadArray)}
    assert "tokenizer.ggml.tokens" in unread and "general.architecture" not in unread
    assert len(pickle.dumps(light)) < len(pickle.dumps(full)) / 4
    for k in unread:
        v, want = light.metadata[k], full.metadata[k]
        assert len(v) == len(want) and v._items is None  # the length alone reads nothing
        assert list(v) == want and v[-1] == want[-1]
    mapped = map_file(light, path)
    want = read_gguf(path, map_data=True)
    for t in full.tensors:
        assert np.array_equal(tensor_data(mapped, t), tensor_data(want, t))
    path.write_bytes(path.read_bytes()[:full.tensors[-1].offset])  # the file shrank since
    with pytest.raises(ValueError, match="truncated GGUF"):
        map_file(light_header(full, path), path)
