"""The torch APIs of the CUDA path (`tests/torch_api.USED`) exist, with the parameters the project
passes (same name, kind and default), in the oldest supported torch (the table recorded from its
sources, `tests/data/torch_api_2.11.json`, provenance inside) and in the installed one (read the
same way from its sources, and resolved at run time); pyproject's torch range starts at the
recorded version and ends below the next untested minor."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from tests.torch_api import USED, signatures

ROOT = Path(__file__).resolve().parents[1]
TABLE = json.loads((ROOT / "tests" / "data" / "torch_api_2.11.json").read_text())
TORCH_DIR = Path(torch.__file__).parent


def _matching(sigs: list, used: tuple[str, ...]) -> list:
    """The overloads that take every parameter in `used` (by name, or through **kwargs)."""
    out = []
    for sig in sigs:
        names = {p[0] for p in sig}
        if all(u in names for u in used) or any(p[1] == "var_keyword" for p in sig):
            out.append(sig)
    return out


def _used_params(sig: list, used: tuple[str, ...]) -> list:
    return [p for p in sig if p[0] in used]


def test_table_provenance():
    assert TABLE["torch_version"] == "2.11.0"
    prov = TABLE["provenance"]
    assert prov["wheel"].startswith("torch-2.11.0-") and re.fullmatch(r"[0-9a-f]{64}", prov["sha256"])
    assert set(TABLE["signatures"]) == set(USED)


@pytest.mark.parametrize("api", sorted(USED))
def test_api_same_in_oldest_supported_and_installed(api):
    file, qualname, used = USED[api]
    old = TABLE["signatures"][api]
    assert old, f"{api} is absent from torch {TABLE['torch_version']}"
    now = signatures(TORCH_DIR, file, qualname)
    assert now, f"{api} is absent from the installed torch {torch.__version__}"
    old_ok, now_ok = _matching(old, used), _matching(now, used)
    assert old_ok, (api, "no overload in torch 2.11 takes", used)
    assert now_ok, (api, "no overload in the installed torch takes", used)
    # the parameters we pass: same names, kinds and defaults in both versions (some overload each)
    old_forms = {json.dumps(_used_params(s, used)) for s in old_ok}
    now_forms = {json.dumps(_used_params(s, used)) for s in now_ok}
    assert old_forms & now_forms, (api, old_forms, now_forms)


@pytest.mark.parametrize("api", sorted(USED))
def test_api_resolves_at_run_time(api):
    obj = torch
    for part in api.split(".")[1:]:
        obj = getattr(obj, part)
    assert callable(obj)


def test_pyproject_torch_range_is_what_is_tested():
    text = (ROOT / "pyproject.toml").read_text()
    spec = re.search(r'"torch([^"]*)"', text).group(1)
    assert spec == ">=2.11,<2.14", spec  # 2.11: this table; 2.13: CI's installed torch
    major, minor = (int(x) for x in torch.__version__.split("+")[0].split(".")[:2])
    assert (2, 11) <= (major, minor) < (2, 14)
