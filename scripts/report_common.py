"""What the report scripts share: size and number formatting, markdown tables and files, result
files, the sections of docs/PERFORMANCE.md that other reports refresh, and matplotlib set-up.

Used by scripts/perf_report.py, moe_report.py, perf_multihost_report.py, bench_recovery.py and
demo_compare.py. Each of them puts its own directory on sys.path before importing this module, so
`python3 scripts/X.py` works from any directory. tests/scripts/report_common_test.py runs every
report on a small fixture (ctest: ScriptsReportCommon).
"""

import json
import sys

# ---- numbers ----------------------------------------------------------------------------------


def human(n):
    """A size in bytes, in the largest binary unit that divides it exactly: 8 B, 1536 B, 4 KiB, 64 MiB, 2 GiB."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return "%d %s" % (n // (1 << shift), unit)
    return "%d B" % n


def ft(us):
    """A time in µs for a table: 3 significant digits below 10, one decimal below 1000, then 12,345."""
    if us is None:
        return ""
    if us >= 1000:
        return "{:,.0f}".format(us)
    return "%.3g" % us if us < 10 else "%.1f" % us


def fb(gbs):
    """A bandwidth in GB/s for a table: 3 significant digits below 1, else 2 decimals."""
    if gbs is None:
        return ""
    return "%.3g" % gbs if gbs < 1 else "%.2f" % gbs


def fr(x):
    """A ratio for a table: 2.26×, and 1,234× from 100 on; "" for None."""
    if x is None:
        return ""
    return "%.2f×" % x if x < 100 else "{:,.0f}×".format(x)


def times(x):
    """A ratio with 2 decimals whatever its size: 1.41×."""
    return "%.2f×" % x


# ---- markdown ---------------------------------------------------------------------------------


def md_row(cells):
    """One table row: | a | b |."""
    return "| " + " | ".join(cells) + " |"


def md_rule(align):
    """The line under a table's header, one column per letter of align: l (---) or r (---:)."""
    return "|" + "".join("---:|" if a == "r" else "---|" for a in align)


def md_table(header, rows, align=None):
    """A table's lines: header, rule (align as in md_rule; left-aligned columns by default), rows."""
    return [md_row(header), md_rule(align or "l" * len(header))] + [md_row(r) for r in rows]


def write_lines(path, lines):
    """Writes lines as one markdown file ending in exactly one newline."""
    with open(path, "w") as f:
        f.write("\n".join(lines).rstrip() + "\n")


def between(text, begin, end):
    """The text between the marker begin and the first end after it, stripped; "" if either is missing."""
    b = text.find(begin)
    e = text.find(end, b + len(begin)) if b >= 0 else -1
    return text[b + len(begin):e].strip() if e >= 0 else ""


def replace_section(path, lines, begin, end=None):
    """In the markdown file at path, replaces the section that starts at the first `begin` by lines:
    up to and including the marker `end`, or without one up to the next "## " heading. Appends
    lines after a blank line when begin is not there. A missing or empty file is left alone.
    Returns whether the file was written."""
    text = read_text(path)
    if not text:
        return False
    block = "\n".join(lines).rstrip() + "\n"
    start = text.find(begin)
    stop = -1 if start < 0 or end is None else text.find(end, start + len(begin))
    if start >= 0 and end is None:
        nxt = text.find("\n## ", start + len(begin))
        text = text[:start] + block + (text[nxt:] if nxt >= 0 else "")
    elif stop >= 0:
        text = text[:start] + block.rstrip("\n") + text[stop + len(end):]
    else:
        text = text.rstrip() + "\n\n" + block
    with open(path, "w") as f:
        f.write(text.rstrip() + "\n")
    return True


# ---- files ------------------------------------------------------------------------------------


def read_text(path, default=""):
    """The file's text, stripped, or default if it cannot be read."""
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return default


def cpu_model():
    """The CPU's model name from /proc/cpuinfo ("?" when it does not say)."""
    for line in read_text("/proc/cpuinfo").splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "?"


def read_json(path, default=None, who=None):
    """The JSON document at path, or default if it cannot be read or parsed (said on stderr
    after "who: " when who is given)."""
    try:
        with open(path) as f:
            return json.load(f)
    except OSError as e:
        if who:
            print("%s: cannot read %s: %s" % (who, path, e), file=sys.stderr)
    except ValueError as e:
        if who:
            print("%s: %s does not parse: %s" % (who, path, e), file=sys.stderr)
    return default


# ---- plots ------------------------------------------------------------------------------------


def pyplot(who=None):
    """matplotlib.pyplot on the Agg backend (files, no display), or None without matplotlib (said
    on stderr as "who: no plot (why); install python3-matplotlib" when who is given)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        if who:
            print("%s: no plot (%s); install python3-matplotlib" % (who, e), file=sys.stderr)
        return None
    return plt


def log_axes(ax, xlabel, ylabel, title=None):
    """Log-log axes, sizes in powers of 2 along x, a light grid at every tick."""
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if title is not None:
        ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
