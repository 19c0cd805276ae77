#!/usr/bin/env python3
"""The tree keeps the shape docs/ARCHITECTURE.md gives it.

Checks, each failing with the file and the include that break it:
  1. every `#include "layer/..."` in src/<layer>/ (and python/) goes to a layer that the table
     below allows (the table of docs/ARCHITECTURE.md, "Layers and what each may use");
  2. the recovery layer reaches the collectives only through their narrow membership
     interface, never through the communicator's internals;
  3. no include cycle between files;
  4. every file under src/ is named in the file map of docs/ARCHITECTURE.md, and every file
     the map names exists.
Usage: layers_test.py REPO_ROOT
"""

import os
import re
import sys

# layer -> layers it may include (besides itself). Mirrors docs/ARCHITECTURE.md.
ALLOWED = {
    "common": set(),
    "bootstrap": {"common"},
    "memory": {"common", "bootstrap"},
    "transport": {"common", "bootstrap", "memory"},
    "coll": {"common", "bootstrap", "memory", "transport"},
    "moe": {"common", "coll"},
    "recovery": {"common", "bootstrap", "memory", "coll"},
    "cli": {"common", "bootstrap", "memory", "transport", "recovery"},
    "python": {"common", "bootstrap", "coll", "moe"},
}
# What recovery may include from coll: the narrow interface only.
RECOVERY_FROM_COLL = {"coll/membership.hpp"}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([a-z_]+)/([A-Za-z0-9_/]+\.(?:hpp|h))"', re.M)


def sources(root):
    """(layer, path relative to root) of every C++ file under src/ and python/."""
    out = []
    for top in ("src", "python"):
        base = os.path.join(root, top)
        for d, _, files in os.walk(base):
            for f in sorted(files):
                if not f.endswith((".cpp", ".hpp", ".h")):
                    continue
                rel = os.path.relpath(os.path.join(d, f), root)
                layer = rel.split(os.sep)[1] if top == "src" else "python"
                out.append((layer, rel))
    return out


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "..")
    root = os.path.abspath(root)
    errors = []
    graph = {}
    files = sources(root)
    if len(files) < 50:
        errors.append(f"found only {len(files)} source files under {root}: wrong root?")
    for layer, rel in files:
        text = open(os.path.join(root, rel), encoding="utf-8").read()
        deps = []
        for target_layer, rest in INCLUDE.findall(text):
            inc = f"{target_layer}/{rest}"
            if target_layer not in ALLOWED:  # e.g. "strata/..." is the public API
                continue
            if target_layer != layer and target_layer not in ALLOWED[layer]:
                errors.append(f"{rel}: includes \"{inc}\": layer '{layer}' may not use '{target_layer}'")
            if layer == "recovery" and target_layer == "coll" and inc not in RECOVERY_FROM_COLL:
                errors.append(f"{rel}: includes \"{inc}\": recovery reaches coll only through "
                              f"{', '.join(sorted(RECOVERY_FROM_COLL))}")
            dep = os.path.join("src", inc)
            if os.path.exists(os.path.join(root, dep)):
                deps.append(dep)
        graph[rel] = deps

    # Include cycles: depth-first search, reporting each cycle once by its path.
    state = {}
    stack = []

    def visit(node):
        state[node] = 1
        stack.append(node)
        for nxt in graph.get(node, []):
            if state.get(nxt) == 1:
                cyc = stack[stack.index(nxt):] + [nxt]
                errors.append("include cycle: " + " -> ".join(cyc))
            elif state.get(nxt) is None:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for n in sorted(graph):
        if state.get(n) is None:
            visit(n)

    # The file map names every file under src/, and only files that exist.
    doc = open(os.path.join(root, "docs", "ARCHITECTURE.md"), encoding="utf-8").read()
    mapped = set(re.findall(r"^\| `(src/[^`]+)` \|", doc, re.M))
    on_disk = {rel for _, rel in files if rel.startswith("src" + os.sep)}
    on_disk |= {os.path.relpath(os.path.join(d, f), root)
                for d, _, fs in os.walk(os.path.join(root, "src")) for f in fs if f == "sources.cmake"}
    for missing in sorted(on_disk - mapped):
        if not missing.endswith("sources.cmake"):
            errors.append(f"docs/ARCHITECTURE.md: the file map does not name {missing}")
    for stale in sorted(mapped - on_disk):
        errors.append(f"docs/ARCHITECTURE.md: the file map names {stale}, which does not exist")

    for e in errors:
        print("FAIL", e)
    n_inc = sum(len(v) for v in graph.values())
    print(f"{len(files)} files, {n_inc} internal includes checked: {len(errors)} problem(s)")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
