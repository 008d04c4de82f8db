"""The pieces of image input one by one (tests/test_vision_reference.py checks them together against
llama.cpp): the kernels the encoders use (dense attention, LayerNorm) against their reference,
mtmd's image preparation (stb_image decoding, Pillow's resampling, smart resize), media in prompts
(markers, token ids, positions, batch cuts) and in requests (b1's base64, URLs and errors)."""
from __future__ import annotations

import base64
import http.server
import io
import threading

import numpy as np
import pytest
import torch
from PIL import Image

import kernels


# ---- kernels ------------------------------------------------------------------------------------

@pytest.mark.parametrize("backend", ["cpu", "triton"])
@pytest.mark.parametrize("T,S,H,KVH,D,dt,masked,cap", [
    (5, 7, 4, 2, 24, torch.float32, False, 0.0), (5, 7, 4, 2, 24, torch.float32, True, 0.0),
    (37, 37, 2, 2, 72, torch.float16, True, 0.0), (9, 40, 2, 1, 16, torch.float16, False, 30.0)])
def test_dense_attention_matches_reference(backend, T, S, H, KVH, D, dt, masked, cap):
    g = torch.Generator().manual_seed(T * S + D)
    q = torch.randn(T, H, D, generator=g)
    k, v = torch.randn(S, KVH, D, generator=g).to(dt), torch.randn(S, KVH, D, generator=g).to(dt)
    mask = None
    if masked:
        mask = torch.rand(T, S, generator=g) > 0.4
        mask[:, 0] = True
    got = kernels.Backend(backend).dense_attention(q, k, v, 0.3, mask, cap)
    # float64 oracle of the same products (q rounded to the keys' type, as the kernels do)
    qq = q.to(dt).double().reshape(T, KVH, H // KVH, D)
    s = torch.einsum("tkgd,skd->tkgs", qq, k.double()) * 0.3
    if cap:
        s = cap * torch.tanh(s / cap)
    if mask is not None:
        s = s.masked_fill(~mask[:, None, None, :], float("-inf"))
    want = torch.einsum("tkgs,skd->tkgd", torch.softmax(s, -1), v.double()).reshape(T, H, D)
    tol = 2e-3 if dt == torch.float16 else 1e-5
    torch.testing.assert_close(got.double(), want, atol=tol, rtol=tol)


@pytest.mark.parametrize("backend", ["cpu", "triton"])
def test_layer_norm_matches_torch(backend):
    x = torch.randn(6, 40) * 3 + 1
    w, b = torch.randn(40), torch.randn(40)
    for ww, bb in ((w, b), (None, None), (w, None)):
        want = torch.nn.functional.layer_norm(x.double(), (40,), None if ww is None else ww.double(),
                                              None if bb is None else bb.double(), 1e-6)
        torch.testing.assert_close(kernels.Backend(backend).layer_norm(x, ww, bb, 1e-6).double(), want,
                                   atol=1e-5, rtol=1e-5)


# ---- images -------------------------------------------------------------------------------------

def _encode(a: np.ndarray, fmt: str, **kw) -> bytes:
    b = io.BytesIO()
    Image.fromarray(a).save(b, fmt, **kw)
    return b.getvalue()


def test_decode_lossless_formats_as_pillow():
    from runtime.vision.image import MediaError, decode

    rng = np.random.default_rng(0)
    a = rng.integers(0, 256, (23, 31, 3), dtype=np.uint8)
    for fmt in ("PNG", "BMP"):
        assert np.array_equal(decode(_encode(a, fmt)), a)
    rgba = np.concatenate([a, rng.integers(0, 256, (23, 31, 1), dtype=np.uint8)], -1)
    assert np.array_equal(decode(_encode(rgba, "PNG")), a)  # alpha dropped (stb_image, req_comp 3)
    gray = a[..., 0]
    assert np.array_equal(decode(_encode(gray, "PNG")), np.repeat(gray[..., None], 3, -1))
    with pytest.raises(MediaError):
        decode(b"not an image at all")
    with pytest.raises(MediaError):
        decode(_encode(a, "PNG"), max_pixels=100)  # bounded before decoding


@pytest.mark.parametrize("src,dst", [((37, 53), (28, 28)), ((100, 80), (224, 112)), ((300, 451), (56, 84)),
                                     ((64, 64), (64, 31))])
def test_resize_is_pillows(src, dst):
    from runtime.vision.image import resize
    from runtime.vision.mmproj import ResizeAlgo

    a = np.random.default_rng(src[0]).integers(0, 256, (*src, 3), dtype=np.uint8)
    for algo, pf in ((ResizeAlgo.BILINEAR, Image.BILINEAR), (ResizeAlgo.BICUBIC, Image.BICUBIC)):
        want = np.asarray(Image.fromarray(a).resize((dst[1], dst[0]), pf))
        assert np.array_equal(resize(a, dst[1], dst[0], algo), want), algo


def test_resize_pad_keeps_the_aspect_ratio():
    from runtime.vision.image import resize_pad
    from runtime.vision.mmproj import ResizeAlgo

    a = np.full((20, 40, 3), 200, dtype=np.uint8)
    out = resize_pad(a, 32, 32, ResizeAlgo.BILINEAR)
    assert out.shape == (32, 32, 3)
    assert (out[:8] == 0).all() and (out[24:] == 0).all() and (out[8:24] == 200).all()  # centred, black bands


def test_smart_size():
    from runtime.vision.image import smart_size

    # aligned to 28, within [8, 4096] tokens of 28 x 28 pixels (Qwen2.5-VL's defaults)
    assert smart_size(640, 480, 28, 8 * 784, 4096 * 784) == (644, 476)
    assert smart_size(50, 70, 28, 8 * 784, 4096 * 784) == (84, 112)  # scaled up to the minimum
    w, h = smart_size(4000, 3000, 28, 8 * 784, 1024 * 784)
    assert w % 28 == 0 and h % 28 == 0 and w * h <= 1024 * 784 and abs(w / h - 4 / 3) < 0.05


# ---- media in prompts ----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def vlm(tmp_path_factory):
    from runtime.tokenizer import load_tokenizer
    from runtime.vision.mmproj import read_mmproj
    from runtime.vision.tiny_mmproj import write_pair

    d = tmp_path_factory.mktemp("vlm-units")
    model, mmproj = write_pair(d, "qwen25vl")
    return load_tokenizer(str(model)), read_mmproj(mmproj)


def test_tokenize_media(vlm):
    from runtime.vision.image import MediaError, MediaTokenizeError
    from runtime.vision.media import media_token, tokenize_media

    tok, mm = vlm
    img = _encode(np.zeros((60, 90, 3), np.uint8), "PNG")
    mp = tokenize_media(tok, "look <M> and <M>!", [img, img], "<M>", mm.vision, mrope=True)
    beg, end = (tok.encode(s, parse_special=True) for s in ("<|vision_start|>", "<|vision_end|>"))
    assert len(beg) == len(end) == 1  # the pair's vocabulary has them as control tokens
    a, b = mp.chunks
    assert mp.tokens[:a.start] == tok.encode("look ", parse_special=True) + beg
    assert mp.tokens[a.end:b.start] == end + tok.encode(" and ", parse_special=True) + beg
    assert mp.tokens[b.end:] == end + tok.encode("!", parse_special=True)
    assert all(t < 0 for t in mp.tokens[a.start:a.end])
    assert mp.tokens[a.start:a.end] == mp.tokens[b.start:b.end] == [media_token(a.id, i) for i in range(a.n_tokens)]
    # 60 x 90 -> 84 x 112 (the minimum of 8 tokens, aligned to 28): a 4 x 3 grid, 4 positions
    assert (a.nx, a.ny, a.n_tokens, a.n_pos) == (4, 3, 12, 4)
    with pytest.raises(MediaTokenizeError):
        tokenize_media(tok, "one <M>", [img, img], "<M>", mm.vision)
    with pytest.raises(MediaError):
        tokenize_media(tok, "<M>", [b"garbage" * 4], "<M>", mm.vision)
    with pytest.raises(MediaError) as e:  # b1 loads every file before it counts the markers
        tokenize_media(tok, "no marker", [b"garbage" * 4], "<M>", mm.vision)
    assert not isinstance(e.value, MediaTokenizeError)
    assert mp.part_starts == [0, a.end + 1, b.end + 1]  # the text after each marker (and its end delimiter)


def test_user_starts_past_media(vlm):
    """Where user messages begin in a prompt with images (llama-server's message spans skip media
    chunks): each rendered prefix's tokens, media included, are the prompt's first tokens."""
    from types import SimpleNamespace

    from api.chat_task import user_starts
    from runtime.vision.media import tokenize_media

    tok, mm = vlm
    img = [_encode(np.zeros((60, 90, 3), np.uint8), "PNG"), _encode(np.full((40, 40, 3), 9, np.uint8), "PNG")]
    full = "<|im_start|>user\n<M> one<|im_end|>\n<|im_start|>user\nsee <M> two<|im_end|>\n<|im_start|>user\nthree"
    mp = tokenize_media(tok, full, img, "<M>", mm.vision, mrope=True)
    prefixes = [full[:c] for c in (i for i in range(1, len(full)) if full.startswith("<|im_start|>user", i))]
    prep = SimpleNamespace(user_prefixes=prefixes + ["<|im_start|>system\nnot a prefix"], media=mp.chunks,
                           part_starts=mp.part_starts)
    got = user_starts(SimpleNamespace(tokenizer=tok, media_marker="<M>"), prep, mp.tokens)
    want = []
    for text in prefixes:
        k = text.count("<M>")
        pre = tokenize_media(tok, text, img[:k], "<M>", mm.vision, mrope=True).tokens
        assert mp.tokens[:len(pre)] == pre
        want.append(len(pre))
    assert got == want and len(set(want)) == 2


def test_prompt_media_cuts_positions_and_prefixes():
    from runtime.serving.media_rows import PromptMedia
    from runtime.vision.media import MediaChunk

    img = MediaChunk(start=5, n_tokens=12, n_pos=4, kind="image", id="ab" * 32, nx=4, ny=3)
    m = PromptMedia([img])
    assert m.cut(0, 100) == 5 and m.cut(5, 2) == 12 and m.cut(17, 9) == 9  # text stops before, media whole
    assert m.align(10) == 5 and m.align(5) == 5 and m.align(17) == 17  # a prefix keeps whole chunks
    assert m.positions(0, 5) is None  # before the image: the KV indices
    assert m.positions(3, 20) == [3, 4] + [5] * 12 + [9, 10, 11]  # the image at t = 5; then 8 fewer
    assert m.total_shift == 8 and m.touches(5) and m.touches(17) and not m.touches(18)
    calls = []
    spans = m.rows(4, 10, lambda c: calls.append(c) or torch.zeros(12, 3))
    assert [(s.start, s.n, s.offset, s.nx) for s in spans] == [(1, 5, 0, 4)] and len(calls) == 1
    m.rows(10, 17, lambda c: calls.append(c))
    assert len(calls) == 1  # encoded once


def test_content_parts_join_as_llama_cpp():
    from runtime.chat.template import _content_to_string

    parts = [{"type": "text", "text": "a"}, {"type": "media_marker", "text": "<M>"},
             {"type": "text", "text": "b"}, {"type": "text", "text": "c"}, {"type": "media_marker", "text": "<M>"}]
    assert _content_to_string(parts) == "a<M>b\nc<M>"
    assert _content_to_string([{"type": "text", "text": ""}, {"type": "text", "text": "x"}]) == "x"


# ---- media in requests ---------------------------------------------------------------------------

def test_base64_decode_as_b1():
    from api.media import base64_decode

    for raw in (b"", b"a", b"ab", b"abc", bytes(range(256))):
        enc = base64.b64encode(raw).decode()
        assert base64_decode(enc) == raw and base64_decode(enc.rstrip("=")) == raw
    assert base64_decode("QUJD!!RUY=") == b"ABC"  # stops at the first character outside the alphabet
    assert base64_decode("QUJDRA") == b"ABCD" and base64_decode("Q") == b""


def test_load_url_errors():
    from api.errors import ApiError
    from api.media import load_url

    cases = {"data:text/plain;base64,AAAA": (400, "Invalid uri format: data:text/plain;base64"),
             "data:image/png,AAAA": (400, "uri must be base64 encoded"),
             "data:image/png;base64,AA,AA": (400, "Invalid uri-encoded base64 value"),
             "!!!!": (500, "Invalid base64 value"),
             "file:///etc/passwd": (400, "file:// URLs are not allowed unless --media-path is specified"),
             "httpfoo": (500, "invalid URL: no scheme"),
             "httpx://x/y": (500, "unsupported URL scheme: httpx"),
             "https://example.invalid/x.png": (500, "HTTPS is not supported. Please rebuild with one of:\n"
                                                    "  -DLLAMA_BUILD_BORINGSSL=ON\n  -DLLAMA_BUILD_LIBRESSL=ON\n"
                                                    "  -DLLAMA_OPENSSL=ON (default, requires OpenSSL dev files "
                                                    "installed)")}
    for url, (status, msg) in cases.items():
        with pytest.raises(ApiError) as e:
            load_url(url)
        assert (e.value.code, e.value.message) == (status, msg), url
    assert load_url("data:image/png;base64," + base64.b64encode(b"xyz").decode()) == b"xyz"


def test_load_url_file_and_http(tmp_path):
    from api.errors import ApiError
    from api.media import load_url

    (tmp_path / "a.png").write_bytes(b"png bytes")
    assert load_url("file://a.png", str(tmp_path) + "/") == b"png bytes"
    for bad in ("file://../x", "file:///abs"):
        with pytest.raises(ApiError, match="file path is not allowed"):
            load_url(bad, str(tmp_path) + "/")
    with pytest.raises(ApiError, match="does not exist"):
        load_url("file://b.png", str(tmp_path) + "/")

    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            ok = self.path == "/img.png"
            self.send_response(200 if ok else 404)
            self.end_headers()
            if ok:
                self.wfile.write(b"image body")

        def log_message(self, *a):
            pass
    srv = http.server.HTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        base = f"http://127.0.0.1:{srv.server_address[1]}"
        assert load_url(base + "/img.png") == b"image body"
        with pytest.raises(ApiError, match="^Failed to download image$"):
            load_url(base + "/missing.png")
    finally:
        srv.shutdown()
    with pytest.raises(ApiError, match="^error: cannot make GET request$"):
        load_url(f"http://127.0.0.1:{srv.server_address[1]}/img.png")  # nobody listens any more


# ---- the encoder through Triton (the interpreter) --------------------------------------------------

def test_vision_encoder_triton_matches_cpu(tmp_path):
    from runtime.vision.encoder import VisionEncoder
    from runtime.vision.image import preprocess
    from runtime.vision.mmproj import read_mmproj
    from runtime.vision.tiny_mmproj import MmprojSpec, write_mmproj

    img = np.random.default_rng(5).integers(0, 256, (40, 50, 3), dtype=np.uint8)
    for spec in (MmprojSpec("gemma3", n_layer=1, image_size=32, scale_factor=2),
                 MmprojSpec("qwen3vl_merger", n_layer=1, patch_size=4, deepstack_layers=(0,), pos_grid=4)):
        mm = read_mmproj(write_mmproj(tmp_path / f"{spec.proj}.gguf", spec))
        px = preprocess(mm.vision, img)
        want = VisionEncoder(mm, backend="cpu").encode(px)
        got = VisionEncoder(mm, backend="triton").encode(px)
        torch.testing.assert_close(got, want, atol=5e-3, rtol=5e-3)


# ---- flags ----------------------------------------------------------------------------------------

def test_media_flags(tmp_path):
    from api.cli import build_parser, engine_config, server_config
    from api.cli_args import ArgError

    args = build_parser().parse_args(["-mm", "p.gguf", "--no-mmproj-offload", "--image-min-tokens", "64",
                                      "--image-max-tokens", "256", "--media-path", str(tmp_path),
                                      "--mtmd-batch-max-tokens", "512", "--video-fps", "2", "--no-mmproj"])
    scfg = server_config(args)
    assert scfg.media_path == str(tmp_path) + "/"
    e = engine_config(args, scfg)
    assert (e.mmproj, e.mmproj_offload, e.image_min_tokens, e.image_max_tokens) == ("p.gguf", False, 64, 256)
    e = engine_config(build_parser().parse_args(["--mmproj", "q.gguf", "-mmdev", "none"]), scfg)
    assert (e.mmproj, e.mmproj_offload) == ("q.gguf", False)
    assert engine_config(build_parser().parse_args([]), scfg).mmproj is None
    with pytest.raises(ArgError, match="not a directory"):
        server_config(build_parser().parse_args(["--media-path", str(tmp_path / "missing")]))


def test_mmproj_url_is_downloaded_once(tmp_path, monkeypatch):
    from runtime.launch.start import fetch_url

    monkeypatch.setenv("TRITIUM_CACHE", str(tmp_path))
    served = []

    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            served.append(self.path)
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"GGUF bytes")

        def log_message(self, *a):
            pass
    srv = http.server.HTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{srv.server_address[1]}/repo/mmproj-f16.gguf"
    try:
        path = fetch_url(url, False, lambda lvl, m: None)
        assert path.endswith("mmproj-f16.gguf") and open(path, "rb").read() == b"GGUF bytes"
        assert fetch_url(url, False, lambda lvl, m: None) == path and served == ["/repo/mmproj-f16.gguf"]
    finally:
        srv.shutdown()
    said = []
    assert fetch_url(url + "?v=2", True, lambda lvl, m: said.append(m)) is None  # offline, not cached
    assert "offline" in said[0]
