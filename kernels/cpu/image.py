"""Image decoding as llama.cpp's mtmd does it (`mtmd_helper_bitmap_init_from_buf`: stb_image,
8-bit RGB): `decode_image(data, max_pixels)` through `image/image.c` (stb_image v2.30, compiled on
first use like the other C kernels), else Pillow (the same pixels for PNG, BMP, GIF and the other
lossless formats; JPEG may differ by a unit in a few pixels: libjpeg's IDCT and upsampling are not
stb_image's).
"""
from __future__ import annotations

import ctypes
import io
from pathlib import Path

from . import native

_p, _i = ctypes.c_void_p, ctypes.c_int
_IP = ctypes.POINTER(ctypes.c_int)
LIBRARY = native.Library("image_decode", ("image.c",), {
    "image_info": ([ctypes.c_char_p, _i, _IP, _IP], _i),
    "image_decode_rgb": ([ctypes.c_char_p, _i, _IP, _IP], _p),
    "image_free": ([_p], None),
}, flags=("-Wno-unused-function",), directory=Path(__file__).resolve().parent / "image", opt_flags=("-O2",))


class ImageTooLarge(ValueError):
    pass


def _pillow(data: bytes, max_pixels: int) -> tuple[int, int, bytes] | None:
    try:
        from PIL import Image
    except ImportError:  # pragma: no cover - Pillow is a dependency
        return None
    try:
        with Image.open(io.BytesIO(data)) as im:
            if im.width * im.height > max_pixels:
                raise ImageTooLarge(f"image of {im.width}x{im.height} pixels is larger than {max_pixels} pixels")
            rgb = im.convert("RGB")
            return rgb.width, rgb.height, rgb.tobytes()
    except ImageTooLarge:
        raise
    except Exception:
        return None


def decode_image(data: bytes, max_pixels: int) -> tuple[int, int, bytes] | None:
    """(width, height, RGB bytes row by row) of an encoded image, or None when it is not one stb_image
    reads. Raises `ImageTooLarge` beyond `max_pixels` (checked before decoding)."""
    lib = native.load(LIBRARY)
    if lib is None:
        return _pillow(data, max_pixels)
    if len(data) >= 2**31:
        return None
    w, h = ctypes.c_int(0), ctypes.c_int(0)
    if not lib.image_info(data, len(data), ctypes.byref(w), ctypes.byref(h)):
        return None
    if w.value <= 0 or h.value <= 0:
        return None
    if w.value * h.value > max_pixels:
        raise ImageTooLarge(f"image of {w.value}x{h.value} pixels is larger than {max_pixels} pixels")
    ptr = lib.image_decode_rgb(data, len(data), ctypes.byref(w), ctypes.byref(h))
    if not ptr:
        return None
    try:
        return w.value, h.value, ctypes.string_at(ptr, w.value * h.value * 3)
    finally:
        lib.image_free(ptr)
