"""Figures for the README, drawn from what the benchmarks print. Needs matplotlib (`pip install -e ".[bench]"`).

    python benchmarks/throughput.py | tee benchmarks/results/throughput.md
    python benchmarks/plot.py throughput benchmarks/results/throughput.md benchmarks/figures/throughput.png

``throughput``: one bar per row and precision of the throughput table, the speed-up over the Hugging
Face model (HF time / Trunk time), with 1.0 (as fast) marked.
"""

from __future__ import annotations

import argparse
from pathlib import Path


def read_markdown_table(path: Path) -> list[dict[str, str]]:
    """The rows of the first markdown table in ``path``, as dicts keyed by the header."""
    lines = [line.strip() for line in path.read_text().splitlines() if line.strip().startswith("|")]
    if len(lines) < 3:
        raise SystemExit(f"error: {path} holds no markdown table: give the output of benchmarks/throughput.py.")
    header = [cell.strip() for cell in lines[0].strip("|").split("|")]
    return [dict(zip(header, (cell.strip() for cell in line.strip("|").split("|")))) for line in lines[2:]]


def throughput_figure(table: Path, output: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in read_markdown_table(table) if r.get("ratio HF / Trunk")]
    if not rows:
        raise SystemExit(f"error: {table} has no 'ratio HF / Trunk' values: is it the output of benchmarks/throughput.py?")
    labels, ratios, colours = [], [], []
    for r in rows:
        what = r["row"].split(" (")[0].split(",")[0]
        hf = r["HF model"].split(",")[1].strip() if "," in r["HF model"] else ""
        labels.append(f"{what}{' (HF ' + hf + ')' if hf else ''}, {r['mode']}, {r['precision']}")
        ratios.append(float(r["ratio HF / Trunk"]))
        colours.append("#4c72b0" if r["precision"] == "fp32" else "#dd8452")
    fig, ax = plt.subplots(figsize=(8, 0.28 * len(rows) + 1.2))
    positions = range(len(rows))[::-1]
    ax.barh(list(positions), ratios, color=colours)
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.set_yticks(list(positions), labels, fontsize=7)
    ax.set_xlabel("speed-up over the Hugging Face model of equal size (HF time / Trunk time)", fontsize=8)
    ax.set_title("Trunk against Hugging Face on CPU (benchmarks/throughput.py)", fontsize=9)
    for y, ratio in zip(positions, ratios):
        ax.text(ratio + 0.02, y, f"{ratio:.2f}", va="center", fontsize=7)
    ax.set_xlim(0, max(ratios) * 1.12)
    ax.legend(handles=[plt.Rectangle((0, 0), 1, 1, color="#4c72b0"), plt.Rectangle((0, 0), 1, 1, color="#dd8452")],
              labels=["fp32", "bf16"], loc="lower right", fontsize=7)
    fig.tight_layout()
    output.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(output, dpi=110, bbox_inches="tight")
    print(f"wrote {output} ({output.stat().st_size / 1024:.0f} kB)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="figure", required=True)
    throughput = commands.add_parser("throughput", help="speed-ups over Hugging Face from benchmarks/throughput.py's table")
    throughput.add_argument("table", type=Path)
    throughput.add_argument("output", type=Path)
    options = parser.parse_args()
    throughput_figure(options.table, options.output)


if __name__ == "__main__":
    main()
