#!/usr/bin/env python3
"""scripts/junit_failures.py names each failed test and the lines that say why.

Feeds it a JUnit report shaped like ctest's (--output-junit): a passed test, a gtest failure
buried in long output, a failure whose output has no cause line, and more failures than it
prints. Checks what it keeps and what it leaves out.

usage: junit_failures_test.py [REPO_ROOT]     (ctest: ScriptsJunitFailures)
"""

import os
import subprocess
import sys
import tempfile

ROOT = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", ".."))
SCRIPT = os.path.join(ROOT, "scripts", "junit_failures.py")


def case(name, status, out):
    failure = '<failure message=""/>' if status == "fail" else ""
    text = out.replace("&", "&amp;").replace("<", "&lt;")
    return f'<testcase name="{name}" classname="{name}" time="1.5" status="{status}">{failure}' \
           f"<system-out>{text}</system-out></testcase>"


def run(xml_body):
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "junit.xml")
        with open(path, "w") as f:
            f.write(f'<?xml version="1.0"?><testsuite name="t">{xml_body}</testsuite>')
        p = subprocess.run([sys.executable, SCRIPT, "main", path], capture_output=True, text=True, check=False)
        return p.returncode, p.stdout


def expect(cond, what, out):
    if not cond:
        print(f"FAIL: {what}\n--- output ---\n{out}")
        sys.exit(1)


def main():
    noise = "".join(f"[ RUN ] Noise.Case{i}\n[ OK ] Noise.Case{i}\n" for i in range(500))
    gtest = noise + "matrix_test.cpp:241: Failure\nScatter dtype=int8 count=7: rank 3 index 2 got 5 want 9\n" \
                    "world=6\n" + noise + "[  FAILED  ] Hosts/CollMatrix.Matches/Scatter_h3x2\n"
    body = case("Passing.One", "run", "Failure in the name of a passing test must not show\n") + \
        case("CollMatrixHosts.Scatter", "fail", gtest) + \
        case("Quiet.Crash", "fail", "starting\nlast words\n")
    rc, out = run(body)
    expect(rc == 0, "exit 0 for a readable report", out)
    expect("Passing.One" not in out, "a passed test is not listed", out)
    expect("[main] CollMatrixHosts.Scatter (1.5 s, 2004 lines of output):" in out, "the failed test and its size", out)
    expect("    matrix_test.cpp:241: Failure" in out and "rank 3 index 2 got 5 want 9" in out,
           "the gtest failure and the line after it", out)
    expect("Noise.Case" not in out, "lines that say nothing of the cause are left out", out)
    expect("[main] Quiet.Crash" in out and "    last words" in out, "no cause line: the output's last lines", out)

    many = "".join(case(f"Bad.N{i}", "fail", "boom: Error\n") for i in range(11))
    rc, out = run(many)
    expect("[main] Bad.N7" in out and "Bad.N8 " not in out, "eight failed tests at most", out)
    expect("... and 3 more failed tests" in out, "the rest counted", out)

    rc, out = run(case("All.Good", "run", "fine\n"))
    expect(rc == 0 and out == "", "nothing printed when nothing failed", out)

    p = subprocess.run([sys.executable, SCRIPT, "main", "/nonexistent/junit.xml"], capture_output=True, text=True,
                       check=False)
    expect(p.returncode == 1 and "cannot read the JUnit report /nonexistent/junit.xml" in p.stdout,
           "an unreadable report is named", p.stdout + p.stderr)
    print("junit_failures: all checks passed")


if __name__ == "__main__":
    main()
