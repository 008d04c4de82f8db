"""The table of qdot's kernels in kernels/README.md is what the C router says (kernels/cpu/qdot_route.c
`qd_route`, the function the drivers of qdot_gemm.c call for every matmul): regenerated from it and
compared, so a route changed without the table fails here (`python -m kernels.cpu.kernel_table`
rewrites it)."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from kernels.cpu import kernel_table, qdot_lib

CPU = Path(kernel_table.__file__).resolve().parent


@pytest.fixture(scope="module")
def lib():
    lb = qdot_lib.lib()
    if lb is None:
        pytest.skip("no C compiler: the router is C")
    return lb


def test_readme_table_is_the_routers(lib):
    text = kernel_table.README.read_text()
    assert text == kernel_table.render(text, lib), \
        "kernels/README.md's qd_route table is out of date: python -m kernels.cpu.kernel_table"


def test_rows_beyond_the_probed_ones_route_as_the_last(lib):
    """The table's last run of rows ("9+") holds for any batch."""
    for t in kernel_table.TYPES:
        for n in kernel_table.NUMERICS:
            for isa in kernel_table.ISAS:
                want = lib.qd_route(t, kernel_table.MAX_ROWS, n, isa)
                assert all(lib.qd_route(t, m, n, isa) == want for m in (65, 100, 512, 4096, 1 << 20))


def test_every_kernel_is_routed_and_named_where_it_is(lib):
    """Each kernel the router can name is reached by some (type, rows, numerics, isa), and its file
    (or the template header beside it) holds the function."""
    reached = {lib.qd_route(t, m, n, i) & 0xFF for t in kernel_table.TYPES for m in (1, 8, 9)
               for n in kernel_table.NUMERICS for i in kernel_table.ISAS}
    k = 0
    while lib.qd_kernel_name(k) is not None:
        name, file = lib.qd_kernel_name(k).decode(), lib.qd_kernel_file(k).decode()
        assert k in reached, name
        fn = name.split()[0]
        text = (CPU / file).read_text() + ((CPU / file).with_suffix(".h").read_text()
                                           if (CPU / file).with_suffix(".h").exists() else "")
        assert re.search(rf"\b{fn}\(", text), (name, file)
        k += 1
    assert k == len(reached)


def test_out_of_range_is_refused(lib):
    assert lib.qd_route(1, 1, 0, 0) == -1  # F16: not a qdot type
    assert lib.qd_route(12, 0, 0, 0) == -1
    assert lib.qd_route(12, 1, 3, 0) == -1
    assert lib.qd_route(12, 1, 0, 4) == -1
    assert lib.qd_kernel_name(-1) is None and lib.qd_kernel_file(99) is None


def test_the_build_reports_its_router_level(lib):
    """qd_isa_level() is the `isa` the drivers pass to qd_route (kernels/cpu/isa.py QDOT_ROUTE_LEVEL)."""
    from kernels.cpu import isa

    assert lib.qd_isa_level() == isa.QDOT_ROUTE_LEVEL[qdot_lib.current_isa()]
