#!/usr/bin/python3
"""sshbuild_plots draws the replica issue's figures from the SSH build's
results (TestMeasureSSHBuild with FERRY_RESULTS set: a line of JSON per
cell and run) and prints their table in Markdown.

    /usr/bin/python3 bench/sshbuild_plots.py RESULTS.jsonl OUTDIR

The figures follow the replication paper's figures 6-8, at the one round
trip the bed has (120 ms between sites, the builder 0 ms from its server):

    sshbuild-sites.png    phases of the build on the local disk, one server
                          at the builder's site, one 120 ms away, and two
                          and three replicas 120 ms apart (figure 6);
    sshbuild-control.png  deep against shallow control (figure 7);
    sshbuild-idle.png     the holder's idle timer at 0.1, 0.5 and 1 s
                          (figure 8).

Each bar stacks the median of each phase over the runs of its cell (the
number of runs is in the label); the figure above it is the median total,
which need not be the bars' sum. Needs matplotlib (Debian: python3-matplotlib).
"""

import json
import statistics
import sys
from collections import defaultdict

PHASES = ["unpack", "configure", "make", "flush"]

FIGURES = [
    ("sshbuild-sites.png", "SSH build at site b: one server or replicas, 120 ms between sites", [
        ("local disk", "local disk"),
        ("one server at the builder's site", "one server\nat b"),
        ("one server 120 ms from the builder", "one server\n120 ms away"),
        ("two replicas 120 ms apart", "two\nreplicas"),
        ("three replicas 120 ms apart", "three\nreplicas"),
    ]),
    ("sshbuild-control.png", "Three replicas: deep against shallow control", [
        ("one server at the builder's site", "one server\nat b"),
        ("three replicas 120 ms apart", "deep\ncontrol"),
        ("three replicas, shallow control only", "shallow\ncontrol only"),
    ]),
    ("sshbuild-idle.png", "Three replicas: the holder's idle timer", [
        ("one server at the builder's site", "one server\nat b"),
        ("three replicas, idle 0.1 s", "idle 0.1 s"),
        ("three replicas, idle 0.5 s", "idle 0.5 s"),
        ("three replicas 120 ms apart", "idle 1 s"),
    ]),
]


def load(name):
    """load returns the runs of each cell: a list of result dicts."""
    runs = defaultdict(list)
    with open(name) as f:
        for line in f:
            line = line.strip()
            if line:
                r = json.loads(line)
                runs[r["cell"]].append(r)
    return runs


def median_phases(rs):
    """median_phases returns the median seconds of each phase and of the
    total, and the median grants of each phase."""
    secs = {p: statistics.median(r["seconds"].get(p, 0) for r in rs) for p in PHASES}
    secs["total"] = statistics.median(r["total"] for r in rs)
    grants = {p: statistics.median(r.get("grants", {}).get(p, 0) for r in rs) for p in PHASES}
    return secs, grants


def table(runs):
    """table returns the Markdown table of every cell, with its ratio to
    one server at the builder's site."""
    base = runs.get("one server at the builder's site")
    base_secs = median_phases(base)[0] if base else None
    out = ["| cell | runs | unpack | configure | make | flush | total | vs one server at b | grants | up (MB) |",
           "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|"]
    for cell, rs in runs.items():
        secs, grants = median_phases(rs)
        ratio = ""
        if base_secs:
            ratio = "%.2fx" % (secs["total"] / base_secs["total"])
        up = statistics.median(r["up_bytes"] for r in rs) / 1e6
        out.append("| %s | %d | %s | %.1f s | %s | %d | %.1f |" % (
            cell, len(rs),
            " | ".join("%.1f s" % secs[p] for p in PHASES),
            secs["total"], ratio, sum(grants.values()), up))
    return "\n".join(out)


def draw(runs, outdir):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    drawn = []
    for fname, title, cells in FIGURES:
        cells = [(c, label) for c, label in cells if c in runs]
        if not cells:
            continue
        fig, ax = plt.subplots(figsize=(1.6 * len(cells) + 2, 4.5))
        bottoms = [0.0] * len(cells)
        for phase in PHASES:
            heights = [median_phases(runs[c])[0][phase] for c, _ in cells]
            ax.bar(range(len(cells)), heights, bottom=bottoms, label=phase, width=0.6)
            bottoms = [b + h for b, h in zip(bottoms, heights)]
        for i, (c, _) in enumerate(cells):
            secs, grants = median_phases(runs[c])
            note = "%.1f s" % secs["total"]
            n = sum(grants.values())
            if n:
                note += "\n%d grant%s" % (n, "" if n == 1 else "s")
            ax.annotate(note, (i, bottoms[i]), ha="center", va="bottom", fontsize=8)
        ax.set_xticks(range(len(cells)))
        ax.set_xticklabels(["%s\n(%d runs)" % (label, len(runs[c])) for c, label in cells], fontsize=8)
        ax.set_ylabel("seconds (median)")
        ax.set_ylim(0, max(bottoms) * 1.2)
        ax.set_title(title, fontsize=10)
        ax.legend(fontsize=8, loc="upper left")
        fig.tight_layout()
        path = outdir.rstrip("/") + "/" + fname
        fig.savefig(path, dpi=110)
        plt.close(fig)
        drawn.append(path)
    return drawn


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: sshbuild_plots.py RESULTS.jsonl OUTDIR")
    runs = load(sys.argv[1])
    if not runs:
        sys.exit("no results in " + sys.argv[1])
    print(table(runs))
    for path in draw(runs, sys.argv[2]):
        print("drew", path, file=sys.stderr)


if __name__ == "__main__":
    main()
