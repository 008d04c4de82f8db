"""Write a tiny random Gemma 3 vision projector (clip.cpp's `gemma3`: SigLIP ViT, average pool,
RMSNorm, projection) for the suite's text model, so that llama.cpp's vision tests run without the
Hub's tinygemma3 (`run.sh` hands it to the tinygemma3 preset with --mmproj). Only gguf and numpy.

Usage: make_mmproj.py OUT.gguf [--n-embd-text 256] [--seed N]
"""
import argparse

import numpy as np
from gguf import GGMLQuantizationType, GGUFValueType, GGUFWriter

ap = argparse.ArgumentParser()
ap.add_argument("out")
ap.add_argument("--n-embd-text", type=int, default=256)  # make_model.py's --embd
ap.add_argument("--seed", type=int, default=1234)
a = ap.parse_args()

C, F, H, L, IMG, P, MERGE = 32, 64, 2, 2, 64, 8, 2  # 64 px images, 8 px patches, 2x2 pool: 16 tokens
rng = np.random.default_rng(a.seed)
w = GGUFWriter(a.out, "clip")
w.add_name("tiny-random-mmproj-gemma3")
w.add_file_type(1)
U32, F32, ARR = GGUFValueType.UINT32, GGUFValueType.FLOAT32, GGUFValueType.ARRAY
w.add_key_value("clip.projector_type", "gemma3", GGUFValueType.STRING)
w.add_key_value("clip.has_vision_encoder", True, GGUFValueType.BOOL)
w.add_key_value("clip.use_gelu", True, GGUFValueType.BOOL)
for key, val in (("embedding_length", C), ("feed_forward_length", F), ("block_count", L),
                 ("attention.head_count", H), ("projection_dim", a.n_embd_text), ("image_size", IMG),
                 ("patch_size", P), ("projector.scale_factor", MERGE)):
    w.add_key_value(f"clip.vision.{key}", val, U32)
w.add_key_value("clip.vision.attention.layer_norm_epsilon", 1e-6, F32)
w.add_key_value("clip.vision.image_mean", [0.5] * 3, ARR, sub_type=F32)
w.add_key_value("clip.vision.image_std", [0.5] * 3, ARR, sub_type=F32)


def put(name, shape, scale=0.05, around=0.0):
    x = (around + rng.standard_normal(shape) * scale).astype(np.float32)
    if len(shape) == 1 or name.startswith("v.position_embd"):
        w.add_tensor(name, x)
    else:
        w.add_tensor(name, x.astype(np.float16), raw_dtype=GGMLQuantizationType.F16)


put("v.patch_embd.weight", (C, 3, P, P))
put("v.patch_embd.bias", (C,))
put("v.position_embd.weight", ((IMG // P) ** 2, C), 0.2)
for i in range(L):
    b = f"v.blk.{i}."
    for n in ("q", "k", "v", "out"):
        put(b + f"attn_{n}.weight", (C, C))
        put(b + f"attn_{n}.bias", (C,))
    for n in ("ln1", "ln2"):
        put(b + f"{n}.weight", (C,), 0.2, 1.0)
        put(b + f"{n}.bias", (C,))
    put(b + "ffn_up.weight", (F, C))
    put(b + "ffn_up.bias", (F,))
    put(b + "ffn_down.weight", (C, F))
    put(b + "ffn_down.bias", (C,))
put("v.post_ln.weight", (C,), 0.2, 1.0)
put("v.post_ln.bias", (C,))
put("mm.soft_emb_norm.weight", (C,), 0.2, 1.0)
put("mm.input_projection.weight", (C, a.n_embd_text))
w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
print("wrote", a.out)
