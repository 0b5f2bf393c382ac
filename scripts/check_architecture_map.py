#!/usr/bin/env python3
"""Check that docs/ARCHITECTURE.md's map of lockstep/ matches the tree.

The map is the first code block under "## Layout": one entry per folder of
lockstep/, a line opening with two spaces and `name/`, continued on the
lines below it. The check, for every such entry:

  - every folder of lockstep/ has an entry, and every folder inside one
    (data/image, parallel/ddp, ...) is named in its entry as `name/`;
    internal/, testdata/ and the fuzzers' corpus are no folders of the map;
  - every public header of the folder (internal/ and *_test_util.h aside)
    is named in the entry, by its file name's stem (`curve_plot`) or the
    class it holds (`CurvePlot`), compared without case or underscores;
  - every file the entry names (a word with an underscore, or ending in .h
    or .cpp, outside backquotes: backquotes hold config keys, commands and
    functions) exists in that folder;
  - no entry names a folder that does not exist.

A failure is printed as `docs/ARCHITECTURE.md:LINE: ...` and exits 1.

Usage (from anywhere; the repository root is found from this file):
    scripts/check_architecture_map.py              exits 1 on any mismatch
    scripts/check_architecture_map.py --root DIR   checks another checkout
"""
import argparse
import os
import re
import sys

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
from cpp_scan import finish

ENTRY = re.compile(r"^  ([a-z0-9_]+)/\s+(.*)$")
NOT_MAP_FOLDERS = {"internal", "testdata", "corpus"}
# A file the entry names: snake_case with an underscore (optionally a path
# and an extension), or anything ending in .h or .cpp.
FILE_WORD = re.compile(r"(?<![A-Za-z0-9_`/.-])((?:[a-z0-9_]+/)*[a-z][a-z0-9]*_[a-z0-9_]*[a-z0-9](?:\.h|\.cpp)?"
                       r"|(?:[a-z0-9_]+/)*[a-z][a-z0-9_]*\.(?:h|cpp))(?![A-Za-z0-9_`])")


def normalise(text):
    return re.sub(r"[^a-z0-9]", "", text.lower())


def map_entries(path):
    """{folder: (first line number, text)} of the map's code block."""
    entries, current, in_block, seen_layout = {}, None, False, False
    with open(path, encoding="utf-8") as text:
        for number, line in enumerate(text, start=1):
            if line.startswith("## Layout"):
                seen_layout = True
            if not seen_layout:
                continue
            if line.startswith("```"):
                if in_block:
                    break
                in_block = True
                continue
            if not in_block:
                continue
            found = ENTRY.match(line)
            if found:
                current = found.group(1)
                entries[current] = [number, found.group(2)]
            elif line[:1] not in (" ", "\n"):
                current = None
            elif current and line.strip():
                entries[current][1] += " " + line.strip()
    return {name: tuple(value) for name, value in entries.items()}


def folder_files(folder):
    """(public header stems, every file stem, subfolders) under `folder`, the map's folders only."""
    headers, stems, subfolders = [], set(), []
    for root, dirs, files in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if d not in NOT_MAP_FOLDERS)
        relative = os.path.relpath(root, folder)
        if relative != ".":
            subfolders.append(relative)
        for name in files:
            stem, extension = os.path.splitext(name)
            stems.add(stem)
            stems.add(name)
            if relative != ".":
                stems.add(os.path.join(relative, name))
                stems.add(os.path.join(relative, stem))
            if extension == ".h" and not stem.endswith("_test_util"):
                headers.append(os.path.normpath(os.path.join(relative, name)))
    # internal/ files may be named (internal/group_checks.h) though they need not be.
    for root, _, files in os.walk(folder):
        if os.path.basename(root) == "internal":
            for name in files:
                stems.add(os.path.join("internal", name))
                stems.add(os.path.splitext(name)[0])
    return sorted(headers), stems, subfolders


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    args = parser.parse_args()
    doc = os.path.join(args.root, "docs", "ARCHITECTURE.md")
    library = os.path.join(args.root, "lockstep")
    entries = map_entries(doc)
    problems = []
    if not entries:
        print("check_architecture_map: docs/ARCHITECTURE.md has no map of lockstep/ under ## Layout")
        return 1
    folders = sorted(d for d in os.listdir(library)
                     if os.path.isdir(os.path.join(library, d)) and d not in NOT_MAP_FOLDERS)
    first_line = min(number for number, _ in entries.values())
    for folder in folders:
        if folder not in entries:
            problems.append(f"docs/ARCHITECTURE.md:{first_line}: lockstep/{folder}/ has no entry in the map")
    for folder, (number, text) in sorted(entries.items()):
        where = f"docs/ARCHITECTURE.md:{number}"
        path = os.path.join(library, folder)
        if not os.path.isdir(path):
            problems.append(f"{where}: the map has {folder}/, and lockstep/{folder} does not exist")
            continue
        headers, stems, subfolders = folder_files(path)
        for sub in subfolders:
            if f"{sub}/" not in text:
                problems.append(f"{where}: lockstep/{folder}/{sub}/ is not named in {folder}/'s entry")
        plain = normalise(text)
        for header in headers:
            stem = os.path.splitext(os.path.basename(header))[0]
            if normalise(stem) not in plain:
                problems.append(f"{where}: lockstep/{folder}/{header} is not named in {folder}/'s entry "
                                f"(by '{stem}' or its class)")
        outside_quotes = re.sub(r"`[^`]*`", " ", text)
        for word in FILE_WORD.findall(outside_quotes):
            if word not in stems and word.rstrip("/") not in subfolders:
                problems.append(f"{where}: {folder}/'s entry names '{word}', which is no file in lockstep/{folder}")
    return finish(problems, f"check_architecture_map: ok, {len(entries)} folders, every public header named")


if __name__ == "__main__":
    sys.exit(main())
