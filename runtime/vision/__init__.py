"""Multimodal input (`--mmproj`): llama.cpp b1-0c1e570's tools/mtmd for the projectors tritium runs.

| file | concern |
| --- | --- |
| `mmproj.py` | the projector GGUF: `ClipConfig` per modality (clip.cpp's keys), weights |
| `image.py` | decoding (stb_image through `kernels.decode_image`), Pillow-compatible resizing, normalization |
| `encoder.py` | the vision encoders (Gemma 3 SigLIP, Qwen2-VL / 2.5-VL / 3-VL) on the kernel dispatch surface |
| `audio.py` | audio: WAV decoding, Whisper's log-mel frames, the Qwen2-Audio encoder (Qwen2.5-Omni) |
| `media.py` | a prompt with media markers -> tokens and `MediaChunk`s (mtmd_tokenize) |
| `tiny_mmproj.py` | tiny random text + mmproj GGUF pairs for tests (scripts/make_tiny_mmproj.py) |

`Multimodal` is what the engine holds (read-only after load): `tokenize(text, files)` (thread-safe:
the API calls it off its event loop, as llama-server tokenizes in its HTTP threads) and
`encode(chunk)` (the engine thread, when the chunk's first row is planned).
"""
from __future__ import annotations

import torch

from runtime.vision.image import MediaError
from runtime.vision.media import MediaChunk, MediaKind, MediaPrompt, tokenize_media
from runtime.vision.mmproj import read_mmproj

__all__ = ["Multimodal", "MediaChunk", "MediaKind", "MediaPrompt", "MediaError"]


class Multimodal:
    def __init__(self, path: str, tokenizer, n_embd_inp: int, mrope: bool, device: str | torch.device = "cpu",
                 image_min_tokens: int = -1, image_max_tokens: int = -1, marker: str = "<__media__>"):
        self.file = read_mmproj(path, image_min_tokens, image_max_tokens)
        self.path = path
        self.tokenizer = tokenizer
        self.marker = marker
        self.mrope = mrope
        self.device = torch.device(device)
        cfg = self.file.vision or self.file.audio
        if n_embd_inp != cfg.n_embd_out:
            raise ValueError(f"mismatch between text model (n_embd = {n_embd_inp}) and mmproj (n_embd = "
                             f"{cfg.n_embd_out})\nhint: you may be using wrong mmproj")
        self.vision = None
        if self.file.vision is not None:
            from runtime.vision.encoder import VisionEncoder
            self.vision = VisionEncoder(self.file, self.device)
        self.audio = None
        if self.file.audio is not None:
            from runtime.vision.audio import AudioEncoder
            self.audio = AudioEncoder(self.file, self.device)

    @property
    def has_vision(self) -> bool:
        return self.vision is not None

    @property
    def has_audio(self) -> bool:
        return self.audio is not None

    def tokenize(self, text: str, files: list[bytes], marker: str | None = None) -> MediaPrompt:
        """The prompt's tokens with its media chunks (`runtime.vision.media.tokenize_media`), the
        media marker `marker` (default: the server's); raises `MediaError` for a file that is no
        usable image or audio clip."""
        return tokenize_media(self.tokenizer, text, files, marker or self.marker,
                              self.file.vision, self.audio, self.mrope)

    def encode(self, chunk: MediaChunk) -> torch.Tensor:
        """[n_tokens, n_embd_inp] float32 on the encoder's device."""
        enc = self.vision if chunk.kind == MediaKind.IMAGE else self.audio
        out = enc.encode(chunk.data)
        if out.shape[0] != chunk.n_tokens:
            raise RuntimeError(f"the encoder made {out.shape[0]} embeddings for a chunk of {chunk.n_tokens} tokens")
        return out
