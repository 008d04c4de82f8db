"""A prompt with media, as llama.cpp b1-0c1e570's mtmd tokenizes it (mtmd_tokenizer): the text is
split at the media marker, each text part tokenized alone (parse_special), each marker replaced by
the media's delimiters (Gemma 3: `<start_of_image>` ... `<end_of_image>`, Qwen-VL:
`<|vision_start|>` ... `<|vision_end|>`, Qwen2.5-Omni audio: `<|audio_bos|>` ... `<|audio_eos|>`)
around a chunk of media tokens, BOS first (and EOS last) as the vocabulary says.

The media tokens of a chunk are negative ids in `MediaPrompt.tokens`, one per token, derived from
the file's SHA-256 (mtmd's chunk id) and the token's index: two prompts with the same image at the
same place share those ids, so a cached prefix covering an image is reused exactly when
llama-server reuses it (`server_tokens::get_common_prefix` compares media chunks by id), and no
id is a vocabulary token.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

from runtime.vision.image import MediaError, MediaTokenizeError, decode, preprocess
from runtime.vision.mmproj import ClipConfig, ProjectorType

__all__ = ["MediaKind", "MediaChunk", "MediaPrompt", "tokenize_media", "media_token", "MEDIA_DELIMS",
           "MAX_MEDIA_TOKENS"]

MAX_MEDIA_TOKENS = 1 << 20  # tokens of one chunk (the id encoding's room)
MEDIA_DELIMS = {  # projector -> (begin, end) text around an image / audio chunk (mtmd_context::init_*)
    ProjectorType.GEMMA3: ("<start_of_image>", "<end_of_image>"),
    ProjectorType.QWEN2VL: ("<|vision_start|>", "<|vision_end|>"),
    ProjectorType.QWEN25VL: ("<|vision_start|>", "<|vision_end|>"),
    ProjectorType.QWEN3VL: ("<|vision_start|>", "<|vision_end|>"),
    ProjectorType.QWEN2A: ("<|audio_bos|>", "<|audio_eos|>"),
}


class MediaKind:
    IMAGE = "image"
    AUDIO = "audio"


@dataclass
class MediaChunk:
    """One image or audio clip of a prompt (plain data for api/; `data` is the runtime's input)."""
    start: int  # index of its first token in the prompt
    n_tokens: int
    n_pos: int  # positions it takes (M-RoPE images: max(nx, ny); otherwise n_tokens)
    kind: str  # MediaKind
    id: str  # SHA-256 of the file (hex)
    nx: int = 0  # M-RoPE grid (tokens per row; 0: 1-D positions)
    ny: int = 0
    bidirectional: bool = False  # its tokens see each other (Gemma 3's images: mtmd's non-causal decode)
    data: Any = None  # the preprocessed input (float32 pixels [H, W, 3] or mel frames)

    @property
    def end(self) -> int:
        return self.start + self.n_tokens


@dataclass
class MediaPrompt:
    tokens: list[int]
    chunks: list[MediaChunk] = field(default_factory=list)
    part_starts: list[int] = field(default_factory=list)  # where the text after the i-th marker begins (0: BOS)


def media_token(file_id: str, i: int) -> int:
    """The negative id of token i of the chunk of the file whose SHA-256 is `file_id`."""
    return -(1 + (int(file_id[:10], 16) << 20) + i)


def _image_chunk(cfg: ClipConfig, rgb, fid: str, mrope: bool) -> MediaChunk:
    pixels = preprocess(cfg, rgb)
    h, w = pixels.shape[:2]
    p = cfg.patch_size
    if cfg.proj is ProjectorType.GEMMA3:
        n = ((w // p) // cfg.n_merge) ** 2
        return MediaChunk(0, n, n, MediaKind.IMAGE, fid, bidirectional=True, data=pixels)
    nx, ny = (w // p) // 2, (h // p) // 2  # clip_n_output_tokens_x / _y (two merged patches per side)
    n = nx * ny
    if not mrope:
        return MediaChunk(0, n, n, MediaKind.IMAGE, fid, data=pixels)
    return MediaChunk(0, n, max(nx, ny), MediaKind.IMAGE, fid, nx=nx, ny=ny, data=pixels)


def tokenize_media(tokenizer, text: str, files: list[bytes], marker: str, vision: ClipConfig | None,
                   audio=None, mrope: bool = False, add_special: bool = True) -> MediaPrompt:
    """mtmd_tokenize(text, files) with `marker` as the media marker (see the module docstring).
    Raises `MediaError` (the request's fault) for a file that is no usable media or when the
    markers and the files do not match in number."""
    loaded = []  # mtmd_helper_bitmap_init_from_buf, every file before tokenizing: a file that is no
    for f in files:  # image or audio fails the request as such whatever the markers
        data = bytes(f)
        if _is_audio(data):
            if audio is None:
                raise MediaError("This model does not support audio input")
            from runtime.vision.audio import decode_wav
            loaded.append((data, decode_wav(data), True))
        else:
            loaded.append((data, decode(data), False))
    parts = text.split(marker) if marker else [text]
    if len(parts) - 1 != len(files):
        raise MediaTokenizeError(f"number of media markers in text ({len(parts) - 1}) does not match number of "
                         f"bitmaps ({len(files)})")
    tokens: list[int] = []
    chunks: list[MediaChunk] = []

    def add_text(s: str) -> None:
        if s:
            tokens.extend(tokenizer.encode(s, add_special=False, parse_special=True))

    part_starts = []
    for i, part in enumerate(parts):
        part_starts.append(len(tokens))
        add_text(part)
        if i == len(files):
            break
        data, decoded, is_audio = loaded[i]
        fid = hashlib.sha256(data).hexdigest()
        if is_audio:
            from runtime.vision.audio import audio_chunks
            cfg, new = audio.cfg, audio_chunks(audio, decoded, fid)
        else:
            if vision is None:
                raise MediaTokenizeError("model does not support vision input")
            cfg, new = vision, [_image_chunk(vision, decoded, fid, mrope)]
        beg, end = MEDIA_DELIMS.get(cfg.proj, ("", ""))
        add_text(beg)
        first = 0  # the chunks of one file (audio: one per 30 s) number their tokens on
        for chunk in new:
            if not 0 < chunk.n_tokens <= MAX_MEDIA_TOKENS:
                raise MediaTokenizeError(f"a media chunk of {chunk.n_tokens} tokens is not supported")
            chunk.start = len(tokens)
            tokens.extend(media_token(fid, first + j) for j in range(chunk.n_tokens))
            first += chunk.n_tokens
            chunks.append(chunk)
        add_text(end)
    if add_special and tokenizer.add_bos and tokenizer.bos_id >= 0:
        tokens.insert(0, tokenizer.bos_id)
        for c in chunks:
            c.start += 1
        part_starts = [0] + [p + 1 for p in part_starts[1:]]
    if add_special and tokenizer.add_eos and tokenizer.eos_id >= 0:
        tokens.append(tokenizer.eos_id)
    return MediaPrompt(tokens, chunks, part_starts)


def _is_audio(data: bytes) -> bool:
    """mtmd-helper's is_audio_file: WAV (RIFF....WAVE), MP3 (ID3 or an MPEG sync word), FLAC."""
    if len(data) < 12:
        return False
    wav = data[:4] == b"RIFF" and data[8:12] == b"WAVE"
    mp3 = data[:3] == b"ID3" or (data[0] == 0xFF and (data[1] & 0xE0) == 0xE0)
    return wav or mp3 or data[:4] == b"fLaC"

