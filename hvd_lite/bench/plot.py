"""Figures for the benchmarks (matplotlib, an optional extra: pip install hvd_lite[plot])."""


def _pyplot():
    try:
        import matplotlib
    except ImportError:
        raise SystemExit("--plot needs matplotlib: pip install 'hvd_lite[plot]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _plain_y(ax) -> None:
    from matplotlib.ticker import FuncFormatter

    fmt = FuncFormatter(lambda v, _: f"{v:g}")
    ax.yaxis.set_major_formatter(fmt)
    ax.yaxis.set_minor_formatter(FuncFormatter(lambda v, _: ""))


def _finish(plt, fig, ax, sizes: list, ylabel: str, title: str, path: str) -> None:
    """The size axis (log 2, a tick every 16x), labels, grid and legend; saves and closes."""
    from .common import format_size

    ax.set_xscale("log", base=2)
    ticks = [s for s in sizes if (s.bit_length() - 1) % 4 == 0] or sizes
    ax.set_xticks(ticks, [format_size(s) for s in ticks])
    ax.set_xlabel("bytes per rank")
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    _plain_y(ax)
    ax.grid(True, which="both", linewidth=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def busbw_vs_size(record: dict, path: str) -> None:
    """Draws each contender's median busbw against the size, from an allreduce record or one of
    the other collectives' (allgather, reducescatter, broadcast, alltoall)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 3.6), dpi=100)
    sizes = [e["bytes"] for e in record["results"]]
    for label in record["contenders"]:
        bw = [e["libs"][label]["busbw_GBps"] for e in record["results"]]
        ax.plot(sizes, bw, marker="o", markersize=3, linewidth=1.2, label=label)
    ax.set_yscale("log")
    _finish(
        plt,
        fig,
        ax,
        sizes,
        "busbw (GB/s, median)",
        f"{record['benchmark']}, {record['ranks']} ranks, {record['dtype']}"
        f"{' ' + record['op'] if 'op' in record else ''}"
        f"{', in place' if record.get('inplace') else ''}",
        path,
    )


def time_ratio(records: list, numerator: str, denominator: str, path: str) -> None:
    """Draws median time(numerator) / time(denominator) against size, one line per record."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 3.6), dpi=100)
    sizes = []
    for rec in records:
        sizes = [e["bytes"] for e in rec["results"]]
        ratio = [
            e["libs"][numerator]["median_s"] / e["libs"][denominator]["median_s"] for e in rec["results"]
        ]
        ax.plot(sizes, ratio, marker="o", markersize=3, linewidth=1.2, label=f"{rec['ranks']} ranks")
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_yscale("log", base=2)
    _finish(
        plt,
        fig,
        ax,
        sizes,
        "time ratio (median)",
        f"{numerator} / {denominator}  (below 1: {numerator} faster)",
        path,
    )
