"""PNG charts of a `bench/vs_spark.py` run, statehold beside Spark, for docs/benchmarks.md.

    python bench/plot_vs_spark.py WORK/results.json DIR   # redraw from a stored run
    python bench/vs_spark.py ... --plot DIR                # run, then draw

Draws from the per-batch figures the run stored (``runs[].batches``), so each chart is
one real run: ``vs-spark-bytes.png``, bytes written per checkpoint over the run (the load
batch 0 left out, as in the tables), and ``vs-spark-storage.png``, the checkpoint
location's size after each batch. Needs matplotlib (the ``bench`` extra).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _workload import Workload

MIB = float(1 << 20)
#: statehold in blues, Spark's variants in warm colours, in run order: the same system,
#: the same colour and marker in both charts.
OURS = (("#1f5fa8", "o"), ("#6fa8dc", "s"))
THEIRS = (("#d9701e", "^"), ("#b3261e", "v"), ("#c9a227", "D"), ("#8e44ad", "x"))


def _styles(systems: list[str]) -> list[tuple[str, str]]:
    ours, theirs = iter(OURS * len(systems)), iter(THEIRS * len(systems))
    return [next(ours if s.startswith("statehold") else theirs) for s in systems]


def plot(results: dict[str, Any], out: Path) -> list[Path]:
    """Both charts of `results` (a results.json document) into `out`; their paths."""
    import matplotlib

    matplotlib.use("Agg")  # files only; no display
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    out.mkdir(parents=True, exist_ok=True)
    w = Workload(**results["workload"])
    runs = results["runs"]
    subtitle = (f"{w.keys:,} keys, {w.fraction:.0%} updated per batch, "
                f"{w.value_size}-byte values, retain {results['args'].get('retain', '?')}")
    charts = [
        ("vs-spark-bytes.png", "Bytes written per checkpoint", "bytes_uploaded", 1,
         w.changed_bytes(1), "changed state per batch"),
        ("vs-spark-storage.png", "Checkpoint storage after each batch", "footprint_bytes", 0,
         w.live_state_bytes(), "live state"),
    ]
    styles = _styles([run["system"] for run in runs])
    written = []
    for name, title, field, first, reference, reference_label in charts:
        fig, ax = plt.subplots(figsize=(8, 3.6), dpi=100)
        for run, (color, marker) in zip(runs, styles, strict=True):
            batches = [b for b in run["batches"] if b["batch"] >= first]
            ax.plot([b["batch"] for b in batches], [b[field] / MIB for b in batches],
                    color=color, marker=marker, markersize=3, linewidth=1.2,
                    label=run["system"])
        ax.axhline(reference / MIB, color="grey", linestyle="--", linewidth=1,
                   label=reference_label)
        ax.set_title(f"{title}\n{subtitle}", fontsize=10)
        ax.set_xlabel("batch (checkpoint)")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylabel("MiB")
        ax.set_ylim(bottom=0)
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=7, loc="upper left", framealpha=0.9)
        fig.tight_layout()
        path = out / name
        fig.savefig(path, pil_kwargs={"optimize": True})
        plt.close(fig)
        written.append(path)
    return written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("results", type=Path, help="a vs_spark.py run's results.json")
    parser.add_argument("out_dir", type=Path, help="where the PNG charts go")
    args = parser.parse_args()
    for path in plot(json.loads(args.results.read_text()), args.out_dir):
        print(path)


if __name__ == "__main__":
    main()
