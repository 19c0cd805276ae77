#!/usr/bin/env python3
"""Why the failed tests of a ctest run failed, in a few lines each.

Reads the JUnit report ctest writes (--output-junit) and prints, for each failed test, its
name and the lines of its output that give the cause: a gtest failure and the lines after it,
an error, a sanitizer report, a timeout. scripts/run_tests.sh prints this at the end of a run,
so that a CI log kept only by its tail still names the cause.

usage: junit_failures.py TREE JUNIT_XML     (prints nothing when no test failed)
"""

import re
import sys
import xml.etree.ElementTree as ET

CAUSE = re.compile(r"Failure|FAILED|[Ee]rror|ERROR|Timeout|timed out|what\(\)|Assertion|Aborted|Segmentation")
MAX_TESTS, MAX_LINES, AFTER, WIDTH = 8, 24, 3, 400


def digest(tree, root):
    """The lines to print for the failed test cases under `root` (an ElementTree element)."""
    failed = [c for c in root.iter("testcase") if c.get("status") == "fail"]
    lines = []
    for case in failed[:MAX_TESTS]:
        out = "".join(ch.text or "" for ch in case if ch.tag == "system-out").splitlines()
        picked, after = [], 0
        for line in out:
            if CAUSE.search(line):
                after = AFTER  # the cause line and the ones that explain it
            if after:
                picked.append(line)
                after -= 1
            if len(picked) >= MAX_LINES:
                break
        seconds = float(case.get("time") or 0)
        lines.append(f"[{tree}] {case.get('name')} ({seconds:.1f} s, {len(out)} lines of output):")
        lines += ["    " + line[:WIDTH] for line in (picked or out[-12:])]
    if len(failed) > MAX_TESTS:
        lines.append(f"[{tree}] ... and {len(failed) - MAX_TESTS} more failed tests")
    return lines


def main(argv):
    if len(argv) != 3:
        sys.stderr.write(__doc__)
        return 2
    try:
        root = ET.parse(argv[2]).getroot()
    except (OSError, ET.ParseError) as e:
        print(f"[{argv[1]}] cannot read the JUnit report {argv[2]}: {e}")
        return 1
    for line in digest(argv[1], root):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
