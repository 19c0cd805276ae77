#!/usr/bin/env python3
"""Every gtest case under tests/ runs in ctest.

Some test binaries list their cases by hand in CMake (one ctest per case, so that a thread
team or a fork does not outlive its case); a case added to the source and not to that list
compiles and never runs. This check lists ctest's tests (ctest -N in the build tree) and
fails naming each TEST(Suite, Name) of tests/ that no ctest test runs: one named Suite.Name,
or one named after the whole suite (Suite, which runs --gtest_filter=Suite.*).

    registered_test.py SOURCE_DIR BUILD_DIR
"""
import pathlib
import re
import subprocess
import sys


def main() -> int:
    src, build = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
    listing = subprocess.run(["ctest", "--test-dir", str(build), "-N"], capture_output=True, text=True, check=True)
    names = set(re.findall(r"^\s*Test\s+#\d+: (\S+)", listing.stdout, re.M))
    missing = []
    for path in sorted((src / "tests").rglob("*.cpp")):
        for suite, case in re.findall(r"^TEST(?:_F)?\((\w+), (\w+)\)", path.read_text(), re.M):
            if f"{suite}.{case}" not in names and suite not in names:
                missing.append(f"{path.relative_to(src)}: {suite}.{case}")
    if not names:
        print("registered_test: ctest -N listed no tests in " + str(build))
        return 1
    for m in missing:
        print("not run by ctest (add it to its CMakeLists.txt): " + m)
    print(f"registered_test: {len(names)} ctest tests, {len(missing)} gtest case(s) missing")
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
