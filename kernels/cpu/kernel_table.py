"""The table "GGML type x rows x numerics x ISA -> kernel, file" of qdot's quantized matmuls, asked
of the C router itself (`qd_route`, kernels/cpu/qdot_route.c, the function the drivers call), and
written into kernels/README.md between the markers below (tests/test_kernel_table.py fails when the
README differs from what the router says).

    python -m kernels.cpu.kernel_table           # rewrite the table in kernels/README.md
    python -m kernels.cpu.kernel_table --check   # exit 1 if it is out of date
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"
BEGIN = "<!-- qd_route table: written by `python -m kernels.cpu.kernel_table`, do not edit -->"
END = "<!-- end of the qd_route table -->"

TYPES = {2: "Q4_0", 3: "Q4_1", 6: "Q5_0", 7: "Q5_1", 8: "Q8_0", 10: "Q2_K", 11: "Q3_K", 12: "Q4_K", 13: "Q5_K",
         14: "Q6_K"}
NUMERICS = {0: "own", 1: "ggml", 2: "ggml-ref"}  # qd_acts.exact: qdot's order, llama.cpp's, its reference
# the router's ISA levels (qdot.h QD_ISA_*) and the qdot builds at each (kernels/cpu/isa.py)
ISAS = {0: "scalar", 1: "avx2", 2: "avxvnni, vnni-emu", 3: "avx512vnni"}
FUSED = 0x100  # QD_ROUTE_FUSED
MAX_ROWS = 64  # row counts probed; every count above answers as this one (checked by the test)


def _lib():
    from . import qdot_lib

    lb = qdot_lib.lib()
    if lb is None:
        raise RuntimeError("qdot kernels unavailable (no C compiler?): the table is asked of their router")
    return lb


def route(qtype: int, rows: int, numerics: int, isa: int, lib=None) -> tuple[str, str, bool]:
    """(kernel, C file, fused) that qd_route picks; fused: through the small-batch driver run_fused
    (the codes decoded in registers from the panels; the ref_* kernels decode them into scratch)."""
    lb = lib or _lib()
    r = lb.qd_route(qtype, rows, numerics, isa)
    if r < 0:
        raise ValueError(f"qd_route({qtype}, {rows}, {numerics}, {isa}): out of range")
    k = r & 0xFF
    return lb.qd_kernel_name(k).decode(), lb.qd_kernel_file(k).decode(), bool(r & FUSED)


def cell(qtype: int, rows: int, numerics: int, isa: int, lib=None) -> str:
    lb = lib or _lib()
    name, file, fused = route(qtype, rows, numerics, isa, lb)
    text = f"`{name}` ({file})" + (", fused" if fused else "")
    if lb.qd_kernel_pair(lb.qd_route(qtype, rows, numerics, isa) & 0xFF):
        k = lb.qd_route_odd(qtype, rows, numerics) & 0xFF  # a pair kernel's odd panel: a 256-bit kernel
        text += f"; odd panel `{lb.qd_kernel_name(k).decode()}`"
    return text


def row_classes(lib=None) -> list[tuple[int, int]]:
    """Runs of row counts (first, last; last None = and up) over which no answer changes."""
    lb = lib or _lib()

    def answers(m):
        return [lb.qd_route(t, m, n, i) for t in TYPES for n in NUMERICS for i in ISAS]

    out, first = [], 1
    for m in range(2, MAX_ROWS + 1):
        if answers(m) != answers(first):
            out.append((first, m - 1))
            first = m
    out.append((first, None))
    return out


def table(lib=None) -> str:
    """The markdown table: per type, the runs of rows that share their kernels, and within each the
    numerics that do, merged."""
    lb = lib or _lib()
    head = "| type | rows | numerics | " + " | ".join(ISAS.values()) + " |"
    lines = [head, "|" + " --- |" * (3 + len(ISAS))]
    for t, tname in TYPES.items():
        runs: list[tuple[int, int | None, dict]] = []
        for first, last in row_classes(lb):
            groups: dict[tuple[str, ...], list[str]] = {}
            for n, nname in NUMERICS.items():
                groups.setdefault(tuple(cell(t, first, n, i, lb) for i in ISAS), []).append(nname)
            if runs and runs[-1][2] == groups:
                runs[-1] = (runs[-1][0], last, groups)
            else:
                runs.append((first, last, groups))
        for first, last, groups in runs:
            rows = f"{first}+" if last is None else str(first) if first == last else f"{first}-{last}"
            for cells, names in groups.items():
                lines.append(f"| {tname} | {rows} | {', '.join(names)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def render(text: str, lib=None) -> str:
    """`text` (the README) with the table between the markers replaced by the router's."""
    if BEGIN not in text or END not in text:
        raise ValueError(f"{README}: the markers {BEGIN!r} / {END!r} are missing")
    a, rest = text.split(BEGIN, 1)
    _, b = rest.split(END, 1)
    return f"{a}{BEGIN}\n{table(lib)}\n{END}{b}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="exit 1 if kernels/README.md differs, write nothing")
    args = ap.parse_args(argv)
    text = README.read_text()
    new = render(text)
    if args.check:
        if new != text:
            print(f"{README}: the qd_route table is out of date (python -m kernels.cpu.kernel_table)", file=sys.stderr)
            return 1
        return 0
    if new != text:
        README.write_text(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
