#!/usr/bin/env python3
"""Check that lockstep's folders form a layered include graph.

Every folder under lockstep/ (core, config, comm, ...; parallel/ with its ddp/
and fsdp/ subfolders counts as the one folder "parallel") sits in a layer, and
a file may include `lockstep/<folder>/...` headers only from its own folder or
from folders in strictly lower layers. The order is LAYERS below; keep it in
step with docs/ARCHITECTURE.md ("a folder uses only folders below it; a
declaration that two layers need goes in the lower one").

Scanned: lockstep/**/*.h and lockstep/**/*.cpp, except unit tests
(*_test.cpp, *_test_util.h), anything under lockstep/fuzz/ and any testdata/
folder. Only quoted includes of the form `#include "lockstep/<folder>/..."`
are edges; system and third-party includes are ignored, as are includes in
// and /* */ comments.

Usage (from anywhere; the repository root is found from this file):
    scripts/check_layers.py            check; prints each violating include as
                                       path:line: lockstep/<from> includes
                                       lockstep/<to> (layer N may use layers < N only)
                                       and exits 1 if there are any, else prints
                                       a one-line summary and exits 0
    scripts/check_layers.py --graph    also print the folder -> folder edges
                                       with include counts
    scripts/check_layers.py --cycles   also print the strongly connected
                                       components of more than one folder (Tarjan),
                                       with the includes that make their edges
    scripts/check_layers.py --root DIR check another checkout

A folder found under lockstep/ that LAYERS does not name is an error (exit 2)
naming it: put a new folder in its layer here before using it.
"""

import argparse
import os
import re
import sys
from collections import defaultdict

# Lowest layer first. A folder may include itself and any folder of a strictly
# lower layer. One folder per layer, so the order is total and no pair of
# folders is left to "may or may not use each other". The order is
# docs/ARCHITECTURE.md's (core -> compat -> config -> events -> comm ->
# optim/model/data -> amp/parallel -> checkpoint -> strategy -> engine -> hooks
# -> the run), with the ties broken the way today's includes already point:
#   optim < model      Model::train_step takes an OptimWrapper& (model.h);
#                      Model::run_train_step picks the overload for one
#                      wrapper or a dict by OptimWrapperBase::as_dict(), so
#                      optim never calls back into Model.
#   model < data       a Dataset yields Batches (model/batch.h).
#   launch after comm  the launcher needs processes and stores, never a model.
#   checkpoint < strategy  checkpoint files are what a Strategy saves and loads;
#                      the Checkpointer and load_pretrained work over a
#                      Strategy and belong above it.
#   builtin_models near the top  the built-in models are for the runner to build;
#                      strategies ask a Model what it supports
#                      (Model::submodules_run_in_cpp), never which one it is.
#   events low         EventStorage, the LogProcessor and the writers need
#                      only core and config; the trainer records into them and
#                      hooks drive the writers. engine < hooks; the Runner
#                      and its default hooks assemble everything and sit on
#                      top ("runner"); the C API (lockstep/lockstep.h,
#                      implemented in capi/) wraps the runner's StepTrainer
#                      for other languages.
LAYERS = [
    ["core"],
    ["compat"],
    ["config"],
    ["events"],
    ["comm"],
    ["launch"],
    ["optim"],
    ["model"],
    ["data"],
    ["evaluation"],
    ["amp"],
    ["parallel"],
    ["checkpoint"],
    ["strategy"],
    ["engine"],
    ["hooks"],
    ["builtin_models"],
    ["runner"],
    ["capi"],
]

# (from_folder, to_folder) pairs in the same layer that may include each other
# in that direction. Empty while every folder has a layer of its own.
ALLOWED_SAME_LAYER = []

# Folders under lockstep/ that are not library code.
IGNORED_FOLDERS = {"fuzz"}

INCLUDE_RE = re.compile(r'^\s*#\s*include\s*"lockstep/([^/"]+)/[^"]*"')


def is_scanned(rel_path):
    """rel_path is relative to lockstep/, with '/' separators."""
    parts = rel_path.split("/")
    if parts[0] in IGNORED_FOLDERS or "testdata" in parts:
        return False
    name = parts[-1]
    if not (name.endswith(".h") or name.endswith(".cpp")):
        return False
    if name.endswith("_test.cpp") or name.endswith("_test_util.h"):
        return False
    return True


def strip_comments(lines):
    """Yields (line_number, code) with /* */ and // comments removed."""
    in_block = False
    for number, line in enumerate(lines, start=1):
        code = []
        i = 0
        while i < len(line):
            if in_block:
                end = line.find("*/", i)
                if end < 0:
                    break
                in_block = False
                i = end + 2
                continue
            if line.startswith("/*", i):
                in_block = True
                i += 2
                continue
            if line.startswith("//", i):
                break
            if line[i] == '"':  # skip string literals (an include's path is one)
                end = i + 1
                while end < len(line) and line[end] != '"':
                    end += 2 if line[end] == "\\" else 1
                code.append(line[i:end + 1])
                i = end + 1
                continue
            code.append(line[i])
            i += 1
        yield number, "".join(code)


def scan(root):
    """Returns (edges, folders): edges[(from, to)] = [(path, line), ...]."""
    lib = os.path.join(root, "lockstep")
    if not os.path.isdir(lib):
        sys.exit(f"check_layers: no lockstep/ folder under {root}")
    edges = defaultdict(list)
    folders = set()
    for dirpath, dirnames, filenames in os.walk(lib):
        dirnames.sort()
        for filename in sorted(filenames):
            full = os.path.join(dirpath, filename)
            rel = os.path.relpath(full, lib).replace(os.sep, "/")
            if "/" not in rel or not is_scanned(rel):
                continue
            source = rel.split("/")[0]
            folders.add(source)
            with open(full, encoding="utf-8", errors="replace") as f:
                lines = f.read().splitlines()
            for number, code in strip_comments(lines):
                m = INCLUDE_RE.match(code)
                if not m:
                    continue
                target = m.group(1)
                if target != source:
                    folders.add(target)
                    edges[(source, target)].append(("lockstep/" + rel, number))
    return edges, folders


def layer_index():
    index = {}
    for n, layer in enumerate(LAYERS):
        for folder in layer:
            if folder in index:
                sys.exit(f"check_layers: '{folder}' is in LAYERS twice")
            index[folder] = n
    return index


def tarjan(nodes, edges):
    """Strongly connected components, each a sorted list of folders."""
    graph = defaultdict(list)
    for (a, b) in edges:
        graph[a].append(b)
    counter = [0]
    index, low, on_stack, stack, components = {}, {}, set(), [], []

    def visit(v):  # recursion depth is bounded by the number of folders
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            components.append(sorted(component))

    for v in sorted(nodes):
        if v not in index:
            visit(v)
    return components


def main():
    parser = argparse.ArgumentParser(
        description="Check lockstep's folder layering (see the module docstring).")
    parser.add_argument("--graph", action="store_true",
                        help="print the folder -> folder edges with include counts")
    parser.add_argument("--cycles", action="store_true",
                        help="print strongly connected components of more than one folder")
    parser.add_argument("--root", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                        help="repository root (default: the checkout holding this script)")
    args = parser.parse_args()

    edges, folders = scan(args.root)
    layer_of = layer_index()

    unknown = sorted(f for f in folders if f not in layer_of)
    if unknown:
        for folder in unknown:
            print(f"check_layers: lockstep/{folder} is not in LAYERS; "
                  f"add it to its layer in scripts/check_layers.py", file=sys.stderr)
        return 2

    if args.graph:
        print("# folder -> folder: includes (layer numbers)")
        for (a, b) in sorted(edges, key=lambda e: (layer_of[e[0]], e[0], layer_of[e[1]], e[1])):
            mark = "" if layer_of[b] < layer_of[a] or (a, b) in ALLOWED_SAME_LAYER else "  <-- violation"
            print(f"{a} -> {b}: {len(edges[(a, b)])}  ({layer_of[a]} -> {layer_of[b]}){mark}")
        print()

    if args.cycles:
        cycles = [c for c in tarjan(folders, edges) if len(c) > 1]
        print(f"# strongly connected components of more than one folder: {len(cycles)}")
        for component in cycles:
            print("{" + ", ".join(component) + "}")
            members = set(component)
            for (a, b) in sorted(edges):
                if a in members and b in members:
                    sites = ", ".join(f"{p}:{n}" for p, n in edges[(a, b)])
                    print(f"    {a} -> {b}: {sites}")
        print()

    violations = []
    for (a, b), sites in edges.items():
        if layer_of[b] < layer_of[a] or (a, b) in ALLOWED_SAME_LAYER:
            continue
        for path, number in sites:
            violations.append((path, number, a, b))
    for path, number, a, b in sorted(violations):
        n = layer_of[a]
        print(f"{path}:{number}: lockstep/{a} includes lockstep/{b} "
              f"(layer {n} may use layers < {n} only)")

    total = sum(len(s) for s in edges.values())
    if violations:
        print(f"check_layers: {len(violations)} layering violation(s) among {total} "
              f"cross-folder includes in {len(folders)} folders", file=sys.stderr)
        return 1
    print(f"check_layers: ok, {total} cross-folder includes in {len(folders)} folders "
          f"respect {len(LAYERS)} layers")
    return 0


if __name__ == "__main__":
    sys.exit(main())
