"""hvd_lite's collectives against SMPI's MPI algorithms on a simulated cluster (SimGrid SMPI).

Builds the C core and sim/driver.c with smpicc into sim/build/, runs the driver with smpirun on one of
sim/platforms/*.xml (a rank a core), once for hvd_lite (HVD_LITE_ALLREDUCE_ALGO=auto unless told, or
HVD_LITE_BROADCAST_ALGO, HVD_LITE_ALLGATHER_ALGO, HVD_LITE_REDUCESCATTER_ALGO, HVD_LITE_ALLTOALL_ALGO for the
other collectives) and once per SMPI algorithm (--cfg=smpi/allreduce:<name>, smpi/bcast, smpi/allgather,
smpi/reduce_scatter, smpi/alltoall), and prints an nccl-tests-style table: the simulated
time of each, the best SMPI algorithm, and hvd_lite / best (docs/scale.md). --op adasum times hvd_lite's
Adasum all-reduce (hvdlAdasum) beside its plain all-reduces and SMPI's, all in the same run, with the ratios.

    python sim/simulate.py --platform 8x8                      # 64 ranks, 4 KiB .. 64 MiB
    python sim/simulate.py --platform 32x8 --sizes 4K,256K     # 256 ranks
    python sim/simulate.py --platform 8x8 --hvdl auto,ring,rd,rab --mpi ompi,mpich
    python sim/simulate.py --coll broadcast --platform 8x8 --sizes 4K,256K,4M --hvdl auto,chain,tree,scatter
    python sim/simulate.py --coll allgather --platform 8x8 --sizes 4K,256K,4M --hvdl auto,ring,rd,rd_far
    python sim/simulate.py --coll alltoall --platform 8x8 --sizes 4K,256K,4M --hvdl auto,pairwise,bruck
    python sim/simulate.py --op adasum --adasum-hierarchical --platform 8x8 --sizes 4M --mpi rab_rdb
    python sim/simulate.py --check --platform 8x8 --ranks 60 --sizes 4,1028,65540,262148 --reps 1
                                                          # the CI correctness run (exit 1 on a wrong bit)
                                                          # (every collective's hier_p2p: on hosts of 4,
                                                          # and 8 hosts of 6;
                                                          # Adasum in 4 types against a float64 reference)
    python sim/simulate.py --judge --platform 16x4_25g,8x8_100g_oversub,8x8_400g_fattree --sizes 4K,256K,4M
                                                          # CI: auto without a model file against the
                                                          # stored SMPI records (FAMILY_RECORDS); exit 1
                                                          # over 1.1x the best SMPI algorithm

Needs Debian's libsimgrid-dev (smpicc, smpirun). The simulation settings, and why (docs/scale.md):
MPI_Test and MPI_Iprobe cost 0.1 us of simulated time, without SMPI's growth of that cost over failed
tests (hvd_lite polls); computation is not simulated, because SMPI runs MPI_Allreduce's reductions inside
the simulator for free, so hvd_lite's are not charged either (--charge-compute charges them, at the speed
of the machine running the simulation). Runs whose buffers would take more than --memory-gib are made with
SMPI's shared buffers, and their results are not checked (wrong = -1).

Each smpirun (one algorithm over the sizes) starts with a progress line on stderr; --quiet leaves them out.
"""

import argparse
import glob
import importlib.util
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
BUILD = os.path.join(HERE, "build")


def _load_progress():
    """hvd_lite/bench/progress.py (a progress line per smpirun on stderr), loaded by its path: this
    script runs without the package and its dependencies."""
    path = os.path.join(ROOT, "hvd_lite", "bench", "progress.py")
    spec = importlib.util.spec_from_file_location("hvd_lite_bench_progress", path)
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


progress = _load_progress()

# The platforms of sim/platforms: name -> (hosts, ranks a host: the cores of each). The first group
# is the one sim/model.conf was written for; the family after it is what the default settings (no
# model file) are judged on (--judge; docs/scale.md, "The family of platforms").
PLATFORMS = {
    "host1x8": (1, 8),
    "8x8": (8, 8),
    "32x8": (32, 8),
    "128x8": (128, 8),
    "512x8": (512, 8),
    "8x8_10g": (8, 8),
    "16x4_25g": (16, 4),
    "8x8bb": (8, 8),
    "8x8_100g_oversub": (8, 8),
    "8x8_400g_fattree": (8, 8),
    "32x8_10g": (32, 8),
    "64x4_25g": (64, 4),
    "32x8bb": (32, 8),
    "32x8_100g_oversub": (32, 8),
    "32x8_400g_fattree": (32, 8),
}
# The SMPI side of each platform of the family, stored (the simulation is deterministic): the records
# under docs/data/scale/ that --judge reads, in order (a later record's figures for a size win).
RECORDS = os.path.join(ROOT, "docs", "data", "scale")
FAMILY_RECORDS = {
    "8x8_10g": ["family/8x8_10g.json", "family/8x8_10g_64m.json"],
    "16x4_25g": ["family/16x4_25g.json", "family/16x4_25g_64m.json"],
    "8x8bb": ["allreduce_64_8x8bb_before.json", "allreduce_64_8x8bb_before_64m.json"],
    "8x8_100g_oversub": ["family/8x8_100g_oversub.json", "family/8x8_100g_oversub_64m.json"],
    "8x8_400g_fattree": ["family/8x8_400g_fattree.json", "family/8x8_400g_fattree_64m.json"],
}
# SMPI's all-reduce algorithms worth racing (its list: smpirun --cfg=smpi/allreduce:help).
MPI_ALGOS = [
    "ompi",
    "mpich",
    "mvapich2",
    "impi",
    "rab_rdb",
    "rdb",
    "lr",
    "ompi_ring_segmented",
    "rab1",
    "rab2",
    "redbcast",
    "smp_rsag",
    "smp_rsag_rab",
    "smp_rdb",
    "smp_binomial",
]
# hier (shared memory within hosts) is not here: the driver runs without the shared-memory path.
HVDL_ALGOS = ["auto", "ring", "rd", "rab", "tree", "hier_p2p", "small"]
# hvd_lite's Adasum all-reduce (--op adasum; hvdlAllReduce with hvdlAdasum), by form: flat, and an average
# within each host with Adasum across hosts (HVD_LITE_ADASUM_HIERARCHICAL=1).
ADASUM_FORMS = {"adasum": "0", "adasum_hier": "1"}
# The types the driver's Adasum takes (sim/driver.c's adasum_types), bytes each.
ADASUM_TYPES = {"float32": 4, "float64": 8, "float16": 2, "bfloat16": 2}
# Per collective: SMPI's --cfg name, hvd_lite's knob and algorithms, the SMPI algorithms raced by
# default (SMPI's lists: smpirun ... --cfg=smpi/bcast:help names them in its error).
COLLS = {
    "allreduce": ("allreduce", "HVD_LITE_ALLREDUCE_ALGO", HVDL_ALGOS, MPI_ALGOS),
    "broadcast": (
        "bcast",
        "HVD_LITE_BROADCAST_ALGO",
        ["auto", "chain", "tree", "scatter", "hier_p2p"],
        [
            "ompi",
            "mpich",
            "mvapich2",
            "impi",
            "binomial_tree",
            "scatter_rdb_allgather",
            "scatter_LR_allgather",
            "ompi_pipeline",
            "ompi_split_bintree",
            "SMP_binomial",
            "SMP_binary",
            "SMP_linear",
            "NTSL",
            "NTSB",
            "arrival_scatter",
            "flattree_pipeline",
            "mvapich2_inter_node",
        ],
    ),
    "allgather": (
        "allgather",
        "HVD_LITE_ALLGATHER_ALGO",
        ["auto", "ring", "rd", "rd_far", "hier_p2p"],
        [
            "ompi",
            "mpich",
            "mvapich2",
            "impi",
            "ring",
            "rdb",
            "bruck",
            "pair",
            "ompi_neighborexchange",
            "smp_simple",
            "SMP_NTS",
            "loosely_lr",
            "2dmesh",
        ],
    ),
    "reducescatter": (
        "reduce_scatter",
        "HVD_LITE_REDUCESCATTER_ALGO",
        ["auto", "ring", "halving", "hier_p2p"],
        [
            "ompi",
            "mpich",
            "mvapich2",
            "impi",
            "ompi_basic_recursivehalving",
            "ompi_ring",
            "ompi_butterfly",
            "mpich_pair",
            "mpich_rdb",
            "mpich_noncomm",
        ],
    ),
    "alltoall": (
        "alltoall",
        "HVD_LITE_ALLTOALL_ALGO",
        ["auto", "pairwise", "bruck", "hier_p2p", "hier_pairs"],
        [
            "ompi",
            "mpich",
            "mvapich2",
            "impi",
            "basic_linear",
            "bruck",
            "pair",
            "ring",
            "rdb",
            "2dmesh",
            "3dmesh",
            "mvapich2_scatter_dest",
            "pair_light_barrier",
            "pair_mpi_barrier",
            "pair_one_barrier",
            "ring_light_barrier",
            "ring_mpi_barrier",
            "ring_one_barrier",
        ],
    ),
}
SIM_CFG = [
    "--cfg=smpi/host-speed:100Gf",
    "--cfg=smpi/test:1e-7",
    "--cfg=smpi/iprobe:1e-7",
    "--cfg=smpi/grow-injected-times:no",
    "--log=root.thres:critical",
]
# hvd_lite's side only: MPI_Allgather as Open MPI chooses it. hvd_lite's collectives send point to
# point, but its set-up gathers a few ints over MPI (hier_p2p's host leaders among them, over every rank),
# and SMPI's default all-gather posts every rank's message to every other at once. Simulating that took
# 33 s at 128 ranks of 64x4_25g and over half an hour at 256 (a profile: SimGrid walking its lists of
# messages in flight as each ends); with Open MPI's choice, 3 s and 7 s, the timed collectives unchanged
# (they start after a barrier of SMPI's default kind, on either side).
HVDL_CFG = ["--cfg=smpi/allgather:ompi"]
UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_size(text: str) -> int:
    m = re.fullmatch(r"(\d+)([KMG]?)(i?B)?", text.strip(), re.IGNORECASE)
    if not m:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 4096, 4K, 64M)")
    return int(m.group(1)) * UNITS[m.group(2).upper()]


def human(nbytes: int) -> str:
    for unit, div in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= div and nbytes % div == 0:
            return f"{nbytes // div} {unit}"
    return f"{nbytes} B"


def _run_bounded(cmd, env, cwd, timeout) -> subprocess.CompletedProcess:
    """Runs cmd to its end, its output captured; past `timeout` seconds kills its whole process group
    (smpirun's smpimain, which outlives a kill of smpirun alone and goes on simulating) and raises
    subprocess.TimeoutExpired."""
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=cwd,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    except BaseException:  # Ctrl-C: no simulation left behind
        os.killpg(proc.pid, signal.SIGKILL)
        raise
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def fmt_time(seconds: float) -> str:
    return f"{seconds * 1e3:.2f} ms" if seconds >= 1e-3 else f"{seconds * 1e6:.1f} us"


def build(verbose: bool = False) -> str:
    """Builds sim/build/driver with smpicc (sim/driver.c, sim/adasum_reference.c and every csrc/**/*.c but
    the Python binding's, csrc/python/), unless it is newer than all of them and the headers."""
    if not shutil.which("smpicc"):
        sys.exit("smpicc not found: install SimGrid (Debian/Ubuntu: apt-get install libsimgrid-dev)")
    os.makedirs(BUILD, exist_ok=True)
    csrc = os.path.join(ROOT, "csrc")
    sources = sorted(
        p
        for p in glob.glob(os.path.join(csrc, "**", "*.c"), recursive=True)
        if os.path.relpath(p, csrc).split(os.sep)[0] != "python"
    )
    out = os.path.join(BUILD, "driver")
    inputs = [*sources, *glob.glob(os.path.join(csrc, "**", "*.h"), recursive=True), __file__]
    inputs += [
        os.path.join(HERE, f) for f in ("driver.c", "adasum_reference.c", "adasum_reference.h", "sim_shim.h")
    ]
    if os.path.exists(out) and os.path.getmtime(out) > max(os.path.getmtime(f) for f in inputs):
        return out  # up to date (CI's --check and --judge, one after the other, build once)
    cmd = [
        "smpicc",
        "-O2",
        "-std=gnu11",
        "-I" + csrc,
        "-include",
        os.path.join(HERE, "sim_shim.h"),
        os.path.join(HERE, "driver.c"),
        os.path.join(HERE, "adasum_reference.c"),
        *sources,
        "-o",
        out,
        "-lpthread",
    ]
    if verbose:
        print(" ".join(cmd), file=sys.stderr)
    subprocess.run(cmd, check=True, cwd=BUILD)
    return out


def hostfile(hosts: int, per_host: int) -> str:
    path = os.path.join(BUILD, f"hosts_{hosts}x{per_host}")
    with open(path, "w") as f:
        f.writelines(f"node-{i}:{per_host}\n" for i in range(hosts))
    return path


def run_driver(
    driver: str,
    platform: str,
    side: str,
    algo: str,
    sizes,
    args,
    check=False,
    per_host=None,
    ranks=None,
    env_extra=None,
    dtype="float32",
):
    """One smpirun: {bytes: parsed output line} for the sizes, run in one or two groups (buffers
    that fit --memory-gib are checked; larger ones share memory and are not). per_host ranks are
    placed on a host (default: the platform's cores a host; ranks: how many in all, default --ranks or
    every slot); env_extra: more HVD_LITE_* variables. An algo of ADASUM_FORMS runs hvd_lite's Adasum
    all-reduce on dtype."""
    hosts, cores = PLATFORMS[platform]
    per_host = per_host or cores
    ranks = ranks or args.ranks or hosts * per_host
    budget = args.memory_gib * (1 << 30)
    fits = [s for s in sizes if 3 * s * ranks <= budget]
    big = [s for s in sizes if s not in fits]
    results = {}
    for group, shared in ((fits, False), (big, True)):
        if not group:
            continue
        env = dict(os.environ, **(env_extra or {}))
        cfg = list(SIM_CFG)
        if not args.charge_compute:
            cfg.append("--cfg=smpi/simulate-computation:no")
        smpi_name, knob, _, _ = COLLS[args.coll]
        if side == "mpi":
            cfg.append(f"--cfg=smpi/{smpi_name}:{algo}")
        else:
            cfg += HVDL_CFG
            if algo in ADASUM_FORMS:
                env["HVD_LITE_ADASUM_HIERARCHICAL"] = ADASUM_FORMS[algo]
            else:
                env[knob] = algo
        if args.model_file:
            env["HVD_LITE_COST_MODEL_FILE"] = os.path.abspath(args.model_file)
        if shared:
            env["SIM_NO_CHECK"] = "1"
            cfg.append(f"--cfg=smpi/auto-shared-malloc-thresh:{min(group) // 2}")
        cmd = [
            "smpirun",
            "-np",
            str(ranks),
            "-platform",
            os.path.join(HERE, "platforms", platform + ".xml"),
            "-hostfile",
            hostfile(hosts, per_host),
            *cfg,
            driver,
            side,
            "--coll",
            args.coll,
            "--reps",
            str(args.reps),
        ]
        if algo in ADASUM_FORMS and side == "hvdl":
            cmd += ["--op", "adasum", "--type", dtype]
        if check:
            cmd.append("--check")
        cmd += [str(s) for s in group]
        with tempfile.TemporaryDirectory() as tmp:  # smpirun writes its temporary files in cwd
            proc = _run_bounded(cmd, env, tmp, args.timeout)
        init_s = None
        for line in proc.stdout.splitlines():
            f = line.split()
            if len(f) == 2 and f[0] == "init_s":  # hvdlCommInitMpi's time, the measurement's most of it
                init_s = float(f[1])
            if len(f) >= 12 and f[0] == "bytes":
                results[int(f[1])] = {
                    "time_s": float(f[3]),
                    "wrong": int(f[5]),
                    "identical": f[7] == "1",
                    "algo": f[9],
                    "model_s": float(f[11]),
                    "failed": "FAILED" in f,
                }
                if "err" in f:  # Adasum's largest error against the float64 reference
                    results[int(f[1])]["err"] = float(f[f.index("err") + 1])
                if init_s is not None:
                    results[int(f[1])]["init_s"] = init_s
        if proc.returncode != 0 or any(s not in results for s in group):
            tail = (proc.stdout + proc.stderr)[-2000:]
            raise RuntimeError(f"{side}:{algo} on {platform} failed (exit {proc.returncode}):\n{tail}")
    return results


def table(platform, ranks, sizes, hvdl, mpi, coll="allreduce", out=sys.stdout):
    """The nccl-tests-style table: hvd_lite's contenders, the best SMPI algorithm, the ratio."""
    print(
        f"\n{ranks} ranks ({platform}: {PLATFORMS[platform][0]} host(s) of {PLATFORMS[platform][1]}), "
        f"simulated time of one {coll} (float32), slowest rank's best",
        file=out,
    )
    cols = [f"hvd_lite {a}" for a in hvdl]
    print(
        "| bytes per rank | " + " | ".join(cols) + " | model (auto's pick) | best MPI algorithm | ratio |",
        file=out,
    )
    print("|---" * (len(cols) + 4) + "|", file=out)
    for s in sizes:
        best = best_mpi(mpi, s)
        first = hvdl[next(iter(hvdl))][s]
        cells = []
        for a in hvdl:
            r = hvdl[a][s]
            cells.append(fmt_time(r["time_s"]) + (f" ({r['algo']})" if a == "auto" else ""))
        ratio = first["time_s"] / mpi[best][s]["time_s"]
        print(
            f"| {human(s)} | " + " | ".join(cells) + f" | {fmt_time(first['model_s'])} | "
            f"{fmt_time(mpi[best][s]['time_s'])} ({best}) | {ratio:.2f}x |",
            file=out,
        )
    inits = sorted({r["init_s"] for r in hvdl[next(iter(hvdl))].values() if "init_s" in r})
    if inits:
        print(f"hvdlCommInitMpi (simulated, slowest rank): {', '.join(fmt_time(t) for t in inits)}", file=out)


def adasum_table(platform, ranks, sizes, forms, plain, mpi, out=sys.stdout):
    """Adasum's table: its forms, hvd_lite's plain all-reduces (a sum) and the best SMPI algorithm of
    the same run, and each form's time over each plain all-reduce's and over the best's."""
    print(
        f"\n{ranks} ranks ({platform}: {PLATFORMS[platform][0]} host(s) of {PLATFORMS[platform][1]}), "
        "simulated time of one all-reduce of float32, Adasum and a sum, slowest rank's best",
        file=out,
    )
    against = list(plain) + (["best MPI"] if mpi else [])
    cols = [f"hvd_lite {a}" for a in (*forms, *plain)] + (["best MPI algorithm"] if mpi else [])
    cols += [f"{f} / {a}" for f in forms for a in against]
    print("| bytes per rank | " + " | ".join(cols) + " |", file=out)
    print("|---" * (len(cols) + 1) + "|", file=out)
    for s in sizes:
        times = {a: side[a][s]["time_s"] for side in (forms, plain) for a in side}
        cells = [fmt_time(forms[f][s]["time_s"]) for f in forms]
        cells += [
            fmt_time(plain[a][s]["time_s"]) + (f" ({plain[a][s]['algo']})" if a == "auto" else "")
            for a in plain
        ]
        if mpi:
            best = best_mpi(mpi, s)
            times["best MPI"] = mpi[best][s]["time_s"]
            cells.append(f"{fmt_time(times['best MPI'])} ({best})")
        cells += [f"{times[f] / times[a]:.2f}x" for f in forms for a in against]
        print(f"| {human(s)} | " + " | ".join(cells) + " |", file=out)


def read_mpi_records(paths, platform, ranks, coll, sizes):
    """The SMPI side from stored records ({algorithm: {bytes: result}}), as run_driver's results, for
    the platform, ranks and collective: every algorithm a record has at a size, a later record's
    figures winning. Raises ValueError naming what a record lacks."""
    mpi = {}
    for path in paths:
        with open(path) as f:
            rec = json.load(f)
        got = (rec["platform"], rec["ranks"], rec.get("coll", "allreduce"))
        if got != (platform, ranks, coll):
            raise ValueError(f"{path} is a record of {got}, not of {(platform, ranks, coll)}")
        for algo, results in rec["mpi"].items():
            for size, r in results.items():
                mpi.setdefault(algo, {})[int(size)] = r
    for s in sizes:
        if not any(s in res for res in mpi.values()):
            raise ValueError(f"no SMPI figures for {human(s)} on {platform} in {', '.join(paths)}")
    return {a: {s: res[s] for s in sizes if s in res} for a, res in mpi.items()}


def best_mpi(mpi, size):
    """The quickest SMPI algorithm at a size whose result was right (all of them, if none was)."""
    have = [a for a in mpi if size in mpi[a]]
    right = [a for a in have if mpi[a][size]["wrong"] <= 0] or have  # a wrong result never wins
    return min(right, key=lambda a: mpi[a][size]["time_s"])


def judge(driver, platforms, sizes, args) -> int:
    """hvd_lite's auto on each platform at the sizes against the best SMPI algorithm of the stored
    records (FAMILY_RECORDS, or --mpi-record): a line per point; 1 if auto is wrong or slower than
    --judge-factor times the best at any point."""
    bad = 0
    bar = progress.Progress("simulate --judge", len(platforms), not args.quiet)
    for platform in platforms:
        bar.point(platform)
        auto = run_driver(driver, platform, "hvdl", "auto", sizes, args)
        mpi = args.mpi_records[platform]
        for s in sizes:
            r, best = auto[s], best_mpi(mpi, s)
            ratio = r["time_s"] / mpi[best][s]["time_s"]
            ok = r["wrong"] <= 0 and not r["failed"] and ratio <= args.judge_factor
            bad += not ok
            verdict = (
                "ok"
                if ok
                else f"FAILED (over {args.judge_factor:g}x" + (", wrong)" if r["wrong"] > 0 else ")")
            )
            print(
                f"{platform} {human(s):>8s}: auto {fmt_time(r['time_s']):>10s} ({r['algo']}), best SMPI "
                f"{fmt_time(mpi[best][s]['time_s']):>10s} ({best}), {ratio:.2f}x  {verdict}",
                flush=True,
            )
    bar.finish()
    return 1 if bad else 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--platform",
        help=f"one of {', '.join(PLATFORMS)} (default 8x8; --judge: several, comma-separated, default the "
        f"family: {','.join(FAMILY_RECORDS)})",
    )
    p.add_argument(
        "--ranks",
        type=int,
        help="use only the first RANKS ranks of the platform (default: all, a rank a core)",
    )
    p.add_argument(
        "--coll",
        choices=list(COLLS),
        default="allreduce",
        help="the collective (default allreduce; broadcast from rank 0, in place)",
    )
    p.add_argument(
        "--op",
        choices=["sum", "adasum"],
        default="sum",
        help="the all-reduce's op (default sum); adasum: hvd_lite's Adasum all-reduce, checked against a "
        "float64 reference, with --hvdl's plain all-reduces and the SMPI ones (a sum) beside it, and the "
        "ratios",
    )
    p.add_argument(
        "--adasum-hierarchical",
        action="store_true",
        help="--op adasum: also its hierarchical form (HVD_LITE_ADASUM_HIERARCHICAL=1: an average within "
        "each host, Adasum across hosts)",
    )
    p.add_argument(
        "--sizes",
        default="4K,256K,4M,64M",
        help="bytes per rank's buffer, comma-separated (default 4K,256K,4M,64M; the "
        "all-gather's result, the reduce-scatter's input, the all-to-all's n blocks)",
    )
    p.add_argument(
        "--hvdl",
        default=None,
        help="hvd_lite's algorithms to run, comma-separated ("
        + "; ".join(f"{c}: {','.join(v[2])}" for c, v in COLLS.items())
        + "); the first is the one compared (default auto; with --op adasum, auto,rab: the plain all-reduces "
        "Adasum is compared with)",
    )
    p.add_argument(
        "--mpi",
        default=None,
        help="SMPI algorithms of the collective, comma-separated ('' for none; default: the list in COLLS)",
    )
    p.add_argument("--reps", type=int, default=3, help="calls timed per size (the best counts)")
    p.add_argument(
        "--check",
        action="store_true",
        help="correctness run: every hvd_lite algorithm, in place too, random floats' bytes "
        "identical on every rank; exit 1 on any wrong element",
    )
    p.add_argument(
        "--charge-compute",
        action="store_true",
        help="simulate hvd_lite's computation (the reductions) at the host's real speed",
    )
    p.add_argument(
        "--model-file",
        help="HVD_LITE_COST_MODEL_FILE for hvd_lite ('' for none: the terms measured at init; default "
        "sim/model.conf, an example of an override written for 8x8 and its like; with --judge, none)",
    )
    p.add_argument(
        "--memory-gib",
        type=float,
        default=4.0,
        help="buffers larger than this in all (3 x bytes x ranks) are shared and unchecked",
    )
    p.add_argument("--timeout", type=float, default=3600, help="seconds per smpirun")
    p.add_argument("--json", help="write every result to this file")
    p.add_argument(
        "--mpi-record",
        help="read the SMPI side from these records (comma-separated --json files of the platform; a "
        "later one's figures win) instead of running it: every algorithm they have at the sizes",
    )
    p.add_argument(
        "--judge",
        action="store_true",
        help="run only hvd_lite's auto on each --platform at the sizes, against the best SMPI algorithm of "
        "its stored records (FAMILY_RECORDS, or --mpi-record); exit 1 where auto is slower than "
        "--judge-factor times the best, or wrong",
    )
    p.add_argument(
        "--judge-factor", type=float, default=1.1, help="--judge: the most auto may take, times the best"
    )
    progress.add_argument(p)
    args = p.parse_args(argv)
    sizes = [parse_size(s) for s in args.sizes.split(",") if s]
    if args.model_file is None:
        args.model_file = "" if args.judge else os.path.join(HERE, "model.conf")
    if args.platform is None:
        args.platform = ",".join(FAMILY_RECORDS) if args.judge else "8x8"
    platforms = [x for x in args.platform.split(",") if x]
    unknown_platforms = [x for x in platforms if x not in PLATFORMS]
    if unknown_platforms or not platforms:
        p.error(f"--platform {args.platform}: not a platform (valid: {', '.join(PLATFORMS)})")
    if len(platforms) > 1 and not args.judge:
        p.error(f"--platform {args.platform}: one platform (several only with --judge)")
    args.platform = platforms[0]
    if args.judge and (
        args.check or args.coll != "allreduce" or args.op != "sum" or args.hvdl not in (None, "auto")
    ):
        p.error("--judge runs hvd_lite's auto all-reduce (a sum) only: no --check, --coll, --op or --hvdl")
    if args.mpi_record or args.judge:
        args.mpi_records = {}
        for x in platforms:
            if args.mpi_record:
                paths = [r for r in args.mpi_record.split(",") if r]
            elif x in FAMILY_RECORDS:
                paths = [os.path.join(RECORDS, r) for r in FAMILY_RECORDS[x]]
            else:
                p.error(f"--judge: {x} has no stored records (FAMILY_RECORDS); pass --mpi-record")
            try:
                x_ranks = args.ranks or PLATFORMS[x][0] * PLATFORMS[x][1]
                args.mpi_records[x] = read_mpi_records(paths, x, x_ranks, args.coll, sizes)
            except (OSError, ValueError, KeyError) as exc:
                p.error(f"the SMPI records: {exc}")
    if args.op == "adasum" and args.coll != "allreduce":
        p.error(f"--op adasum: Adasum is an all-reduce only, not --coll {args.coll}")
    if args.adasum_hierarchical and args.op != "adasum":
        p.error("--adasum-hierarchical is a form of --op adasum")
    if args.hvdl is None:
        args.hvdl = "auto,rab" if args.op == "adasum" else "auto"
    hvdl_algos = [a for a in args.hvdl.split(",") if a]
    if args.mpi is None:
        args.mpi = ",".join(COLLS[args.coll][3])
    mpi_algos = [a for a in args.mpi.split(",") if a] if not args.mpi_record else []  # not run: stored
    unknown = [a for a in hvdl_algos if a not in COLLS[args.coll][2]]
    if unknown:
        p.error(
            f"--coll {args.coll}: hvd_lite has no algorithm {unknown[0]!r} "
            f"(valid: {','.join(COLLS[args.coll][2])})"
        )
    slots = PLATFORMS[args.platform][0] * PLATFORMS[args.platform][1]
    ranks = args.ranks or slots
    if not 1 <= ranks <= slots:
        p.error(f"--ranks {ranks}: the platform {args.platform} has {slots} slots")
    unchecked = [s for s in sizes if 3 * s * ranks > args.memory_gib * (1 << 30)]
    if args.check and unchecked:
        p.error(
            f"--check: {human(unchecked[0])} on {ranks} ranks needs more than --memory-gib "
            f"{args.memory_gib:g} for its buffers, whose results could not be checked; pass "
            "smaller --sizes (CI: 4,1028,65540,262148) or a larger --memory-gib"
        )
    driver = build()
    if args.judge:
        return judge(driver, platforms, sizes, args)

    if args.check:  # every algorithm of every collective
        bad = 0
        hosts = PLATFORMS[args.platform][0]
        HIER = ("hier_p2p", "hier_pairs")  # on hosts of one size only
        runs = [("allreduce", a, a, {}) for a in HVDL_ALGOS if a not in HIER]
        if hosts > 1:  # hier_p2p needs hosts of one size: emulated hosts of 4, and 6 ranks a host
            runs += [
                ("allreduce", "hier_p2p", "hier_p2p/4", {"env_extra": {"HVD_LITE_RANKS_PER_HOST": "4"}}),
                ("allreduce", "hier_p2p", "hier_p2p/6", {"per_host": 6, "ranks": 6 * min(hosts, ranks // 6)}),
            ]
        # Adasum in each type, against its float64 reference (the fold: 60 ranks combine 28 pairs first);
        # the hierarchical form on emulated hosts of 4 (at 60 ranks, 15 of them: the fold across hosts too).
        runs += [("allreduce", "adasum", f"adasum {t}", {"dtype": t}) for t in ADASUM_TYPES]
        if ranks % 4 == 0:  # hosts of one size
            hosts_of_4 = {"env_extra": {"HVD_LITE_RANKS_PER_HOST": "4"}}
            runs += [("allreduce", "adasum_hier", "adasum_hier/4", hosts_of_4)]
        others = ("broadcast", "allgather", "reducescatter", "alltoall")
        runs += [(c, a, a, {}) for c in others for a in COLLS[c][2] if a not in HIER]
        if hosts > 1:  # the same emulated hosts of 4, and 6 ranks a host, for the two-level ones
            runs += [
                (c, a, f"{a}/{k}", how)
                for c in others
                for a in COLLS[c][2]
                if a in HIER
                for k, how in (
                    (4, {"env_extra": {"HVD_LITE_RANKS_PER_HOST": "4"}}),
                    (6, {"per_host": 6, "ranks": 6 * min(hosts, ranks // 6)}),
                )
            ]

        # The all-gather's, reduce-scatter's and all-to-all's buffers are n equal float32 blocks:
        # sizes rounded down to a multiple of 4n bytes (n the run's ranks).
        def blocks(n):
            return sorted({max(s - s % (4 * n), 4 * n) for s in sizes})

        bar = progress.Progress("simulate --check", len(runs), not args.quiet)
        for coll, a, label, how in runs:
            bar.point(f"{coll} {label}")
            args.coll = coll
            size = ADASUM_TYPES[how.get("dtype", "float32")]
            run_sizes = sizes
            if coll in ("allgather", "reducescatter", "alltoall"):
                run_sizes = blocks(how.get("ranks", ranks))
            elif a in ADASUM_FORMS:  # whole elements of the type
                run_sizes = sorted({s + -s % size for s in sizes})
                # The types differ only in the kernels' loads, stores and rounding, which the smaller
                # sizes cross; the largest, most of a run's wall time, is left to float32.
                if how.get("dtype", "float32") != "float32":
                    run_sizes = run_sizes[:-1] or run_sizes
            res = run_driver(driver, args.platform, "hvdl", a, run_sizes, args, check=True, **how)
            for s, r in sorted(res.items()):
                ok = r["wrong"] == 0 and r["identical"] and not r["failed"]
                bad += not ok
                err = f" err {r['err']:.2g}" if "err" in r else ""
                print(
                    f"{args.platform} {coll} hvdl {label:15s} {human(s):>8s}: {r['algo']:8s} "
                    f"{fmt_time(r['time_s']):>10s} wrong {r['wrong']} identical {int(r['identical'])}{err}"
                    f"{'' if ok else '  <-- FAILED'}"
                )
        bar.finish()
        return 1 if bad else 0

    forms = (
        ["adasum", "adasum_hier"] if args.adasum_hierarchical else ["adasum"] if args.op == "adasum" else []
    )
    bar = progress.Progress(
        f"simulate {args.coll}", len(forms) + len(hvdl_algos) + len(mpi_algos), not args.quiet
    )

    def run(side, algo):
        bar.point(f"{side} {algo}")
        return run_driver(driver, args.platform, side, algo, sizes, args)

    adasum = {f: run("hvdl", f) for f in forms}

    def gather(side, algos, into):
        for a in algos:
            try:
                into[a] = run(side, a)
            except subprocess.TimeoutExpired as exc:  # past --timeout: the others still run
                print(f"skipped {side}:{a}: {str(exc).splitlines()[0]}", file=sys.stderr)
            except RuntimeError as exc:  # an SMPI algorithm that fails here
                if side == "hvdl":
                    raise
                print(f"skipped {side}:{a}: {str(exc).splitlines()[0]}", file=sys.stderr)
        return into

    hvdl = gather("hvdl", hvdl_algos, {})
    mpi = dict(args.mpi_records[args.platform]) if args.mpi_record else {}  # the stored SMPI side
    gather("mpi", mpi_algos, mpi)
    bar.finish()
    wrong = [
        (a, s) for side in (adasum, hvdl, mpi) for a in side for s, r in side[a].items() if r["wrong"] > 0
    ]
    if adasum:
        adasum_table(args.platform, ranks, sizes, adasum, hvdl, mpi)
    elif mpi and hvdl:
        table(args.platform, ranks, sizes, hvdl, mpi, args.coll)
    elif mpi:  # every hvd_lite run was skipped (timed out, failed): the SMPI side is still kept
        print(f"\nno hvd_lite run finished; {ranks} ranks on {args.platform}, the best SMPI algorithm:")
        for s in sizes:
            if any(s in mpi[a] for a in mpi):
                best = best_mpi(mpi, s)
                print(f"  {human(s)}: {fmt_time(mpi[best][s]['time_s'])} ({best})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "command": "python3 sim/simulate.py "
                    + shlex.join(sys.argv[1:] if argv is None else argv),
                    "platform": args.platform,
                    "ranks": ranks,
                    "coll": args.coll,
                    "op": args.op,
                    "charge_compute": args.charge_compute,
                    "adasum": adasum,
                    "hvdl": hvdl,
                    "mpi": mpi,
                },
                f,
                indent=1,
            )
    if wrong:
        print(f"wrong results: {wrong}", file=sys.stderr)
    return 1 if wrong or (hvdl_algos and not hvdl) else 0


if __name__ == "__main__":
    sys.exit(main())
