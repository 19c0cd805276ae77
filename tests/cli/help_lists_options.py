#!/usr/bin/env python3
"""Every option a subcommand's parser accepts must appear in that subcommand's --help.

The options are read from the parser sources (string literals compared with `arg` or passed
to take_option), so adding an option to a parser without a help line fails this test.
usage: help_lists_options.py STRATA_BINARY SRC_CLI_DIR
"""
import re
import subprocess
import sys
from pathlib import Path

# subcommand -> the files whose parse loop handles its options
PARSERS = {
    "run": ["run.cpp"],
    "bench": ["bench_args.cpp"],
    "info": ["info.cpp"],
    "store": ["store_cmd.cpp"],
    "bench moe": ["bench_moe.cpp"],
}
# Options the launcher passes to its own children; users never type them, so help omits them.
INTERNAL = {"bench": {"--as-rank", "--worker-fds"}, "bench moe": {"--worker-fds"}}

OPTION = re.compile(r'"(--?[A-Za-z][A-Za-z0-9_-]*)"')
PARSE_LINE = re.compile(r'==\s*"-|take_option\(')


def parser_options(src_dir, files):
    found = set()
    for name in files:
        for line in (src_dir / name).read_text().splitlines():
            if PARSE_LINE.search(line):
                found.update(OPTION.findall(line))
    return found


def main():
    strata, src_dir = sys.argv[1], Path(sys.argv[2])
    missing = []
    for cmd, files in PARSERS.items():
        opts = parser_options(src_dir, files) - INTERNAL.get(cmd, set())
        if not opts:
            missing.append(f"{cmd}: no options found in {files} (did the parser move?)")
        out = subprocess.run([strata, *cmd.split(), "--help"], capture_output=True, text=True, timeout=30)
        text = out.stdout + out.stderr
        if out.returncode != 0:
            missing.append(f"{cmd} --help exited with {out.returncode}")
        for opt in sorted(opts):
            # whole-word match, so '--np' is not satisfied by '--nproc' nor '-n' by '-np'
            if not re.search(r'(?<![A-Za-z0-9_-])' + re.escape(opt) + r'(?![A-Za-z0-9_-])', text):
                missing.append(f"strata {cmd} --help does not mention {opt}")
    for m in missing:
        print(m)
    print(f"{'FAIL' if missing else 'ok'}: checked {', '.join(PARSERS)}")
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
