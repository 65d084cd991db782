"""Plots of sim/simulate.py's --json records (docs/scale.md): per record, the simulated time of
hvd_lite's compared contender (the first of --hvdl, usually auto) and of the best SMPI algorithm at
each size, and their ratio.

    python sim/plot.py docs/data/scale/allreduce_64.json -o docs/img/scale_allreduce_64.png
    python sim/plot.py A.json B.json ... -o out.png        # records of one platform, merged

Needs matplotlib (pip install hvd_lite[plot]).
"""

import argparse
import json


def merged(paths):
    """One record from several of the same platform and collective: every contender's results."""
    out = None
    for path in paths:
        with open(path) as f:
            rec = json.load(f)
        if out is None:
            out = {
                "platform": rec["platform"],
                "ranks": rec["ranks"],
                "coll": rec.get("coll", "allreduce"),
                "hvdl": {},
                "mpi": {},
            }
        elif (rec["platform"], rec.get("coll", "allreduce")) != (out["platform"], out["coll"]):
            raise SystemExit(f"{path}: another platform or collective than {paths[0]}")
        for side in ("hvdl", "mpi"):
            for name, sizes in rec.get(side, {}).items():
                out[side].setdefault(name, {}).update(sizes)
    return out


def series(rec, first):
    """(sizes, hvd_lite times, best MPI times, best MPI names) over the sizes both sides have."""
    hv = rec["hvdl"][first]

    def usable(r):
        return r and not r.get("failed") and r.get("wrong", 0) <= 0

    sizes, ht, mt, mn = [], [], [], []
    for size in sorted(hv, key=int):
        best = [(r[size]["time_s"], name) for name, r in rec["mpi"].items() if usable(r.get(size))]
        if not usable(hv[size]) or not best:
            continue
        t, name = min(best)
        sizes.append(int(size)), ht.append(hv[size]["time_s"]), mt.append(t), mn.append(name)
    return sizes, ht, mt, mn


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("json", nargs="+")
    p.add_argument("-o", "--out", required=True)
    p.add_argument("--hvdl", default="auto", help="hvd_lite contender to plot (default auto)")
    args = p.parse_args()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rec = merged(args.json)
    sizes, ht, mt, mn = series(rec, args.hvdl)
    fig, (ax, bx) = plt.subplots(2, 1, figsize=(6.4, 5.6), sharex=True, gridspec_kw={"height_ratios": [2, 1]})
    ax.loglog(sizes, [t * 1e6 for t in ht], "o-", label=f"hvd_lite {args.hvdl}")
    ax.loglog(sizes, [t * 1e6 for t in mt], "s--", label="best SMPI algorithm")
    for s, t, name in zip(sizes, mt, mn):
        ax.annotate(name, (s, t * 1e6), textcoords="offset points", xytext=(4, -12), fontsize=7)
    ax.set_ylabel("simulated time (us)")
    ax.set_title(f"{rec['coll']}, {rec['ranks']} simulated ranks ({rec['platform']})")
    ax.legend()
    ax.grid(True, which="both", alpha=0.3)
    bx.semilogx(sizes, [h / m for h, m in zip(ht, mt)], "o-")
    bx.axhline(1.0, color="gray", lw=0.8)
    bx.set_ylabel("hvd_lite / best")
    bx.set_xlabel("bytes per rank")
    bx.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
