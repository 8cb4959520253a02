"""Figures for the README, drawn from what the benchmarks print. Needs matplotlib (`pip install -e ".[bench]"`).

    python benchmarks/throughput.py | tee benchmarks/results/throughput.md
    python benchmarks/plot.py throughput benchmarks/results/throughput.md benchmarks/figures/throughput.png

``throughput``: one bar per row and precision of the throughput table, the speed-up over the Hugging
Face model (HF time / Trunk time), with 1.0 (as fast) marked.

``curves``: learning curves from the ``metrics.csv`` of one or several runs (CSVLogger, which every
run writes), one panel per metric, one line per run:

    python benchmarks/plot.py curves runs.png --run scratch=runs/sst2/lightning_logs/version_0/metrics.csv \
        --run pretrained=runs/sst2_finetune/lightning_logs/version_0/metrics.csv --metric val/sst2/acc train/loss --x
        epoch

``transfer``: each task's gain over training it alone per way (jointly, jointly then alone, merged, other samplers
and merges), mean and standard deviation of the gains paired by seed, one panel per group, from
benchmarks/transfer.py's ledger, or benchmarks/distill.py's (the same layout: its students against their teacher,
which is the task alone; ``--groups`` picks panels, ``--title`` names the figure):

    python benchmarks/plot.py transfer runs/transfer/results.jsonl benchmarks/figures/transfer.png
    python benchmarks/plot.py transfer runs/distill/results.jsonl benchmarks/figures/distill.png --groups ner sick \
        --title "Students against their teachers (benchmarks/distill.py)"
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

from ledger import TRUNK_VERSION, Ledger, add_version_option, precision_of, way_name


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
        raise SystemExit(
            f"error: {table} has no 'ratio HF / Trunk' values: is it the output of benchmarks/throughput.py?"
        )
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


def read_series(path: Path, metric: str, x: str) -> tuple[list[float], list[float]]:
    """(x, value) of every row of a metrics.csv where ``metric`` was logged."""
    if not path.is_file():
        raise SystemExit(
            f"error: {path} does not exist: give the metrics.csv of a run (in its CSV logger's version_N folder)."
        )
    with open(path, newline="") as f:
        rows = [r for r in csv.DictReader(f) if r.get(metric) not in (None, "")]
    xs = [float(r[x]) + (1 if x == "epoch" else 0) for r in rows if r.get(x) not in (None, "")]  # epochs counted from 1
    return xs, [float(r[metric]) for r in rows if r.get(x) not in (None, "")]


def curves_figure(output: Path, runs: list[str], metrics: list[str], x: str, title: str | None) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    parsed = []
    for run in runs:
        label, _, path = run.partition("=")
        if not path:
            raise SystemExit(f"error: --run {run!r}: write LABEL=PATH/metrics.csv.")
        parsed.append((label, Path(path)))
    fig, axes = plt.subplots(1, len(metrics), figsize=(4.2 * len(metrics), 3.2), squeeze=False)
    for ax, metric in zip(axes[0], metrics):
        drawn = 0
        for label, path in parsed:
            xs, ys = read_series(path, metric, x)
            if xs:
                ax.plot(xs, ys, marker="o" if len(xs) < 30 else None, markersize=3, linewidth=1.2, label=label)
                drawn += 1
        if not drawn:
            raise SystemExit(
                f"error: no run logged {metric!r}; the runs' columns are in the first line of their metrics.csv."
            )
        ax.set_title(metric, fontsize=9)
        ax.set_xlabel(x, fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    output.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(output, dpi=100, bbox_inches="tight")
    print(f"wrote {output} ({output.stat().st_size / 1024:.0f} kB)")


WAYS = {"joint": "jointly", "mtdnn": "jointly, then alone (MT-DNN)", "sequential": "the large task, then alone",
        "merged": "merged (TIES)"}
FLOOR = -8.0  # points: a bar below is cut there and labelled with its value (a failed merge would flatten the rest)


def transfer_figure(ledger: Path, output: Path, groups: list[str] | None = None,
                    title: str = "Related tasks on one MiniLM trunk: each way against each task alone "
                                 "(benchmarks/transfer.py)", version: int | None = None) -> None:
    """``version``: the Trunk version whose records are drawn (a ledger keeps every version's; a panel mixing two
    would pair runs of different code); None: this code's."""
    import statistics

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    version = version or TRUNK_VERSION
    records = Ledger(ledger, version).records()
    held = sorted({r["group"] for r in records})
    if groups and (missing := sorted(set(groups) - set(held))):
        raise SystemExit(f"error: {ledger} holds no run of Trunk version {version} of the groups {missing}: its "
                         f"groups of that version are {held} (--trunk-version N draws another's).")
    records = [{**r, "way": way_name(r)} for r in records if not groups or r["group"] in groups]
    # each run against its task alone of the same seed and precision
    alone = {(r["group"], r["task"], r["seed"], precision_of(r)): r["scores"][r["task"]] for r in records
             if r["way"] == "alone"}
    others = [r for r in records if r["way"] != "alone"]
    if not others:
        raise SystemExit(f"error: {ledger} holds no run to compare with alone: give the results.jsonl of "
                         "benchmarks/transfer.py once a joint or merged way has finished.")
    panels = list(dict.fromkeys(r["group"] for r in others))
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.4), squeeze=False)
    # the recipe's ways in WAYS' order, then other samplers and merges (benchmarks/transfer.py --sampling, --merge)
    found = list(dict.fromkeys(r["way"] for r in others))
    labels = {**WAYS, **{way: way for way in found if way not in WAYS}}
    palette = ["#4c72b0", "#dd8452", "#55a868", "#8172b3", "#937860", "#da8bc3", "#ccb974", "#64b5cd", "#c44e52",
               "#8c8c8c", "#1b9e77", "#e7298a", "#66a61e", "#e6ab02", "#404040", "#a6761d"]  # 16 before one repeats
    # colours for the ways drawn only: WAYS' own first, in its order
    colours = dict(zip([*(way for way in WAYS if way in found), *sorted(set(found) - set(WAYS))], palette * 3))
    for ax, group in zip(axes[0], panels):
        mine = [r for r in others if r["group"] == group]
        tasks = list(dict.fromkeys(task for r in mine for task in r["scores"]))
        ways = [way for way in colours if any(r["way"] == way for r in mine)]
        width = 0.8 / len(ways)
        for k, way in enumerate(ways):
            gains = [[100 * (r["scores"][task] - alone[paired]) for r in mine
                      if r["way"] == way and task in r["scores"]
                      and (paired := (group, task, r["seed"], precision_of(r))) in alone]
                     for task in tasks]
            means = [statistics.mean(g) if g else 0.0 for g in gains]
            spreads = [statistics.stdev(g) if len(g) > 1 else 0.0 for g in gains]
            xs = [i + (k - (len(ways) - 1) / 2) * width for i in range(len(tasks))]
            ax.bar(xs, [max(m, FLOOR) for m in means], width, yerr=[s if m > FLOOR else 0 for m, s in
                                                                     zip(means, spreads)],
                   capsize=2, color=colours[way], label=labels[way])
            for x, m in zip(xs, means):
                if m < FLOOR:
                    ax.text(x, FLOOR, f"{m:.0f}", ha="center", va="bottom", fontsize=6, rotation=90, color="white")
        ax.axhline(0, color="black", linewidth=0.8)
        ax.set_ylim(bottom=max(ax.get_ylim()[0], FLOOR - 0.5))
        ax.set_xticks(range(len(tasks)), tasks, fontsize=8)
        ax.set_ylabel("test score - alone's, points (mean ± sd, paired by seed)", fontsize=7)
        seeds = sorted({r["seed"] for r in mine})
        ax.set_title(f"{group} ({'seeds' if len(seeds) > 1 else 'seed'} {', '.join(map(str, seeds))})", fontsize=9)
        ax.grid(axis="y", alpha=0.3)
    fig.suptitle(title, fontsize=9)
    # each way once, below the panels
    legend = {label: handle for ax in axes[0] for handle, label in zip(*ax.get_legend_handles_labels())}
    fig.legend(legend.values(), legend.keys(), fontsize=7, loc="upper center", ncol=3, bbox_to_anchor=(0.5, 0.0))
    fig.tight_layout()
    output.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(output, dpi=110, bbox_inches="tight")
    print(f"wrote {output} ({output.stat().st_size / 1024:.0f} kB)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="figure", required=True)
    throughput = commands.add_parser(
        "throughput", help="speed-ups over Hugging Face from benchmarks/throughput.py's table"
    )
    throughput.add_argument("table", type=Path)
    throughput.add_argument("output", type=Path)
    curves = commands.add_parser("curves", help="learning curves from runs' metrics.csv files")
    curves.add_argument("output", type=Path)
    curves.add_argument(
        "--run", action="append", required=True, help="LABEL=PATH/metrics.csv (repeat for several runs)"
    )
    curves.add_argument(
        "--metric", nargs="+", required=True, help="columns to draw, one panel each (e.g. train/loss val/sst2/acc)"
    )
    curves.add_argument("--x", choices=["step", "epoch"], default="step")
    curves.add_argument("--title")
    transfer = commands.add_parser("transfer", help="each task's score per way against alone, from "
                                   "benchmarks/transfer.py's or distill.py's ledger")
    transfer.add_argument("ledger", type=Path, help="the results.jsonl of benchmarks/transfer.py or distill.py")
    transfer.add_argument("output", type=Path)
    transfer.add_argument("--groups", nargs="+", help="only these groups' panels (the ledger's group names)")
    transfer.add_argument("--title", help="the figure's title (default: transfer.py's)")
    add_version_option(transfer)
    options = parser.parse_args()
    if options.figure == "throughput":
        throughput_figure(options.table, options.output)
    elif options.figure == "transfer":
        transfer_figure(options.ledger, options.output, options.groups,
                        **({"title": options.title} if options.title else {}), version=options.trunk_version)
    else:
        curves_figure(options.output, options.run, options.metric, options.x, options.title)


if __name__ == "__main__":
    main()
