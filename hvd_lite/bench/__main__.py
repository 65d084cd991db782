"""Command line of hvd_lite.bench: one subcommand per benchmark module."""

import argparse
import sys
from typing import Dict, List, Optional, Protocol

from . import allreduce, collectives, elastic, fit, fusion, kernels, latency, model, replot


class Command(Protocol):
    """A benchmark: a module (or collectives.Command) with these two functions."""

    def add_arguments(self, p: argparse.ArgumentParser) -> None: ...

    def main(self, args: argparse.Namespace) -> Optional[int]: ...


COMMANDS: Dict[str, Command] = {
    "allreduce": allreduce,
    "fusion": fusion,
    "allgather": collectives.Command("allgather"),
    "reducescatter": collectives.Command("reducescatter"),
    "broadcast": collectives.Command("broadcast"),
    "alltoall": collectives.Command("alltoall"),
    "kernels": kernels,
    "latency": latency,
    "model": model,
    "fit": fit,
    "elastic": elastic,
    "plot": replot,
}


def build_parser() -> argparse.ArgumentParser:
    """The parser with one subparser per registered benchmark."""
    parser = argparse.ArgumentParser(prog="python -m hvd_lite.bench", description="hvd_lite benchmarks")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, module in COMMANDS.items():
        doc = (module.__doc__ or "").strip().splitlines()[0]
        p = sub.add_parser(
            name, help=doc, description=module.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
        )
        module.add_arguments(p)
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    """Parses argv and runs the chosen benchmark."""
    args = build_parser().parse_args(argv)
    return COMMANDS[args.command].main(args) or 0


if __name__ == "__main__":
    sys.exit(main())
