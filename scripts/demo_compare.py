#!/usr/bin/env python3
"""`make demo`'s comparison: all_reduce on 4 local ranks, 8 B - 16 MiB, Strata next to Open MPI
and torch's gloo where they are installed; prints a table and saves a plot (matplotlib).

usage: demo_compare.py BUILD_DIR OUT_DIR   (a few seconds; the figures are quick, not docs/PERFORMANCE.md)
"""
import json
import os
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from report_common import log_axes, pyplot  # noqa: E402

N, MIN, MAX, FACTOR = 4, "8", "16M", "8"
QUICK = ["--target-ms", "20", "--repeats", "3", "-q"]


def run(name, cmd, out):
    env = dict(os.environ)
    if os.geteuid() == 0:  # containers run as root; Open MPI refuses that unless told
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    try:
        p = subprocess.run(cmd + ["--json", out], capture_output=True, text=True, timeout=120, env=env)
    except (OSError, subprocess.TimeoutExpired) as e:
        print(f"  {name}: skipped ({e})")
        return None
    if p.returncode != 0:
        print(f"  {name}: skipped (exit {p.returncode}: {(p.stderr or p.stdout).strip()[-200:]})")
        return None
    with open(out) as f:
        return {r["size"]: r for r in json.load(f)["results"]}


def human(n):
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:g} {unit}"
        n /= 1024


def main():
    build, out_dir = sys.argv[1], sys.argv[2]
    os.makedirs(out_dir, exist_ok=True)
    sizes = ["-b", MIN, "-e", MAX, "-f", FACTOR]
    systems = {"strata": run("strata", [f"{build}/strata", "bench", "all_reduce", "-n", str(N)] + sizes + QUICK,
                             f"{out_dir}/strata.json")}
    mpi_bench = f"{build}/bench/peers/mpi_bench"
    if shutil.which("mpirun") and os.access(mpi_bench, os.X_OK):
        systems["Open MPI"] = run("Open MPI", ["mpirun", "--oversubscribe", "-np", str(N), mpi_bench, "all_reduce"]
                                  + sizes + QUICK + ["--label", "openmpi"], f"{out_dir}/openmpi.json")
    else:
        print("  Open MPI: skipped (mpirun or bench/peers/mpi_bench missing: scripts/install_bench_deps.sh)")
    py = "/usr/bin/python3" if os.access("/usr/bin/python3", os.X_OK) else sys.executable
    if subprocess.run([py, "-c", "import torch.distributed"], capture_output=True).returncode == 0:
        here = os.path.dirname(os.path.abspath(__file__))
        # the same sizes as the others; gloo is far slower at small sizes, so capped iterations
        # keep it to seconds
        systems["gloo"] = run("gloo", [py, os.path.join(here, "..", "bench", "peers", "torch_bench.py"), "all_reduce",
                                       "-n", str(N)] + sizes + ["--max-iters", "50", "--label", "gloo"] + QUICK,
                              f"{out_dir}/gloo.json")
    else:
        print("  gloo: skipped (no torch for /usr/bin/python3)")
    systems = {k: v for k, v in systems.items() if v}
    if "strata" not in systems:
        print("demo_compare: strata bench failed")
        return 1
    names = list(systems)
    print(f"all_reduce, {N} ranks on this host, float32 sum: time per call in us (lower is better)")
    print(f"{'size':>10}" + "".join(f"{n:>12}" for n in names) + "   strata speed-up")
    for size in sorted(systems["strata"]):
        cells, ups = "", []
        for n in names:
            r = systems[n].get(size)
            cells += f"{r['time_us']:>12.1f}" if r else f"{'-':>12}"
            if r and n != "strata":
                ups.append(f"{r['time_us'] / systems['strata'][size]['time_us']:.1f}x vs {n}")
        print(f"{human(size):>10}{cells}   {', '.join(ups)}")
    plt = pyplot()
    if plt is None:
        print("plot skipped: no matplotlib for this python (apt-get install python3-matplotlib)")
        return 0
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for n in names:
        pts = sorted(systems[n].items())
        ax.plot([s for s, _ in pts], [r["time_us"] for _, r in pts], marker="o", label=n)
    log_axes(ax, "bytes per rank", "time per all_reduce (us)",
             f"all_reduce, {N} ranks on one host (make demo, quick sweep)")
    ax.legend()
    path = os.path.join(out_dir, "demo_all_reduce.png")
    fig.savefig(path, dpi=110, bbox_inches="tight")
    print(f"plot saved: {os.path.abspath(path)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
