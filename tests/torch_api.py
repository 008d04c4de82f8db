"""The torch APIs the CUDA path calls (`runtime/model/cuda_graphs.py`, `kernels/triton/*`, the device
parts of `runtime/model/decoder.py`, `runtime/parallel/group.py` and `runtime/serving/bootstrap.py`,
`scripts/gpu_check.py`), with the
parameters the project passes, and their signatures read from a torch source tree without
importing it (Python files by `ast`, the C functions from the generated `.pyi` stubs).

    python tests/torch_api.py SRC --wheel FILE.whl --out tests/data/torch_api_2.11.json

records the table of an older torch (SRC: the wheel unpacked; any platform's wheel carries the same
Python sources and stubs, e.g. the 80 MB macOS arm64 one instead of the multi-GB CUDA build);
`tests/test_torch_api.py` checks it and the installed torch against `USED`.
"""
from __future__ import annotations

import ast
import functools
import hashlib
import json
import sys
from pathlib import Path

# api -> (file under torch/, qualified name in that file, parameters the project passes)
USED: dict[str, tuple[str, str, tuple[str, ...]]] = {
    # runtime/model/cuda_graphs.py
    "torch.cuda.CUDAGraph": ("cuda/graphs.py", "CUDAGraph.__new__", ()),
    "torch.cuda.CUDAGraph.replay": ("cuda/graphs.py", "CUDAGraph.replay", ()),
    "torch.cuda.graph": ("cuda/graphs.py", "graph.__init__", ("cuda_graph", "pool")),
    "torch.cuda.graph_pool_handle": ("cuda/graphs.py", "graph_pool_handle", ()),
    "torch.cuda.Stream": ("cuda/streams.py", "Stream.__new__", ()),
    "torch.cuda.Stream.wait_stream": ("cuda/streams.py", "Stream.wait_stream", ("stream",)),
    "torch.cuda.Event": ("cuda/streams.py", "Event.__new__", ("enable_timing",)),
    "torch.cuda.Event.record": ("cuda/streams.py", "Event.record", ()),
    "torch.cuda.Event.synchronize": ("cuda/streams.py", "Event.synchronize", ()),
    "torch.cuda.Event.elapsed_time": ("cuda/streams.py", "Event.elapsed_time", ("end_event",)),
    "torch.cuda.current_stream": ("cuda/__init__.py", "current_stream", ()),
    "torch.cuda.stream": ("cuda/__init__.py", "stream", ("stream",)),
    "torch.cuda.is_available": ("cuda/__init__.py", "is_available", ()),
    "torch.cuda.synchronize": ("cuda/__init__.py", "synchronize", ()),
    "torch.cuda.get_device_properties": ("cuda/__init__.py", "get_device_properties", ("device",)),
    "torch.cuda.get_device_name": ("cuda/__init__.py", "get_device_name", ("device",)),
    "torch.inference_mode": ("autograd/grad_mode.py", "inference_mode.__init__", ()),
    # runtime/parallel/group.py (-tp: NCCL on CUDA)
    "torch.distributed.init_process_group": ("distributed/distributed_c10d.py", "init_process_group",
                                             ("backend", "rank", "world_size")),
    "torch.distributed.all_reduce": ("distributed/distributed_c10d.py", "all_reduce", ("tensor",)),
    "torch.distributed.all_gather": ("distributed/distributed_c10d.py", "all_gather", ("tensor_list", "tensor")),
    "torch.distributed.all_gather_object": ("distributed/distributed_c10d.py", "all_gather_object",
                                            ("object_list", "obj")),
    "torch.distributed.broadcast_object_list": ("distributed/distributed_c10d.py", "broadcast_object_list",
                                                ("object_list", "src")),
    # factories (C functions: generated stubs); the keywords the CUDA path passes
    "torch.zeros": ("_C/_VariableFunctions.pyi", "zeros", ("dtype", "device", "pin_memory")),
    "torch.full": ("_C/_VariableFunctions.pyi", "full", ("size", "fill_value", "dtype", "device")),
    "torch.ones": ("_C/_VariableFunctions.pyi", "ones", ("dtype", "device")),
    "torch.arange": ("_C/_VariableFunctions.pyi", "arange", ("start", "end", "dtype", "device")),
    "torch.empty": ("_C/_VariableFunctions.pyi", "empty", ("dtype", "device")),
    "torch.empty_like": ("_C/_VariableFunctions.pyi", "empty_like", ("input",)),
    "torch.randn": ("_C/_VariableFunctions.pyi", "randn", ("dtype", "device")),
    "torch.randperm": ("_C/_VariableFunctions.pyi", "randperm", ("n", "device")),
    "torch.tensor": ("_C/_VariableFunctions.pyi", "tensor", ("data", "dtype", "device")),
    "torch.cat": ("_C/_VariableFunctions.pyi", "cat", ("tensors", "dim")),
    "torch.cumsum": ("_C/_VariableFunctions.pyi", "cumsum", ("input", "dim")),
    # Tensor methods (class TensorBase in the stub)
    "torch.Tensor.copy_": ("_C/__init__.pyi", "TensorBase.copy_", ("non_blocking",)),
    "torch.Tensor.is_pinned": ("_C/__init__.pyi", "TensorBase.is_pinned", ()),
    "torch.Tensor.to": ("_C/__init__.pyi", "TensorBase.to", ("device", "dtype")),
    "torch.Tensor.contiguous": ("_C/__init__.pyi", "TensorBase.contiguous", ()),
    "torch.Tensor.stride": ("_C/__init__.pyi", "TensorBase.stride", ()),
    "torch.Tensor.data_ptr": ("_C/__init__.pyi", "TensorBase.data_ptr", ()),
    "torch.Tensor.fill_": ("_C/__init__.pyi", "TensorBase.fill_", ("value",)),
    "torch.Tensor.split": ("_C/__init__.pyi", "TensorBase.split", ("split_size", "dim")),
    "torch.Tensor.argmax": ("_C/__init__.pyi", "TensorBase.argmax", ("dim",)),
}


def _params(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> list[list]:
    """[name, kind, default source or None] per parameter: annotations left out (their spelling
    changes between releases without changing a call)."""
    a = fn.args
    out = []
    pos = a.posonlyargs + a.args
    defaults = [None] * (len(pos) - len(a.defaults)) + [ast.unparse(d) for d in a.defaults]
    for i, (p, d) in enumerate(zip(pos, defaults)):
        out.append([p.arg, "positional_only" if i < len(a.posonlyargs) else "positional_or_keyword", d])
    if a.vararg:
        out.append([a.vararg.arg, "var_positional", None])
    for p, d in zip(a.kwonlyargs, a.kw_defaults):
        out.append([p.arg, "keyword_only", ast.unparse(d) if d is not None else None])
    if a.kwarg:
        out.append([a.kwarg.arg, "var_keyword", None])
    return out


@functools.lru_cache(maxsize=16)
def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text())


def signatures(torch_dir: Path, file: str, qualname: str) -> list[list[list]]:
    """Every definition (overloads included) of `qualname` in torch_dir/file, as `_params` lists."""
    tree = _tree(torch_dir / file)
    *outer, name = qualname.split(".")
    body = tree.body
    for cls in outer:
        node = next((n for n in body if isinstance(n, ast.ClassDef) and n.name == cls), None)
        if node is None:
            return []
        body = node.body
    return [_params(n) for n in body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == name]


def table(torch_dir: Path) -> dict[str, list[list[list]]]:
    return {api: signatures(torch_dir, f, q) for api, (f, q, _) in USED.items()}


def main(argv=None) -> int:
    import argparse

    ap = argparse.ArgumentParser()
    ap.add_argument("src", help="a torch wheel unpacked (the folder holding torch/)")
    ap.add_argument("--wheel", required=True, help="the wheel file it came from (provenance)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    torch_dir = Path(args.src) / "torch"
    version = {}
    exec((torch_dir / "version.py").read_text().split("\ngit_version")[0], version)  # __version__ only
    data = {
        "torch_version": version["__version__"],
        "provenance": {
            "wheel": Path(args.wheel).name,
            "sha256": hashlib.sha256(Path(args.wheel).read_bytes()).hexdigest(),
            "how": "pip download torch==VERSION --no-deps --platform macosx_11_0_arm64 --python-version 3.12 "
                   "--only-binary :all:; unzipped; python tests/torch_api.py SRC --wheel WHL --out OUT",
        },
        "signatures": table(torch_dir),
    }
    sigs = data.pop("signatures")
    text = json.dumps(data, indent=1)[:-2] + ',\n "signatures": {\n' + ",\n".join(
        f"  {json.dumps(k)}: {json.dumps(v)}" for k, v in sigs.items()) + "\n }\n}\n"
    data["signatures"] = sigs
    assert json.loads(text) == data
    Path(args.out).write_text(text)
    missing = [k for k, v in data["signatures"].items() if not v]
    print(f"{len(data['signatures'])} APIs recorded from torch {data['torch_version']}; missing: {missing or 'none'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
