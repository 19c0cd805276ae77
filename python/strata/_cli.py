"""The `strata` command of a pip-installed package: runs the launcher binary shipped in it."""

import os
import sys


def main():
    exe = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bin", "strata")
    if not os.access(exe, os.X_OK):
        sys.exit(f"strata: the launcher binary {exe} is missing: this strata package was not installed "
                 "with pip (in a CMake tree the launcher is <build>/strata)")
    # exec, not a child: signals, the exit status and the terminal belong to the launcher.
    os.execv(exe, ["strata"] + sys.argv[1:])


if __name__ == "__main__":
    main()
