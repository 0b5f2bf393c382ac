#!/usr/bin/env python3
"""Check that docs/ARCHITECTURE.md's index of Notes points at the Notes.

Every entry of the index has the form

    - Note [Name] (`path/to/file`): why ...

and the file it names must hold that Note's text: a comment line that opens
with `Note [Name]` (`// Note [Name]` or `# Note [Name]`, possibly followed by
more text on the line). A Note moved to another file without its index entry
(or an entry naming a file that no longer exists) is an error, printed as

    docs/ARCHITECTURE.md:LINE: Note [Name] is not in path/to/file

Usage (from anywhere; the repository root is found from this file):
    scripts/check_notes_index.py              exits 1 on any such entry, else
                                              prints a one-line summary
    scripts/check_notes_index.py --root DIR   checks another checkout
"""
import argparse
import os
import re
import sys

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
from cpp_scan import finish

ENTRY = re.compile(r"^- Note \[([^\]]+)\] \(`([^`]+)`\)")


def holds_note(path, name):
    pattern = re.compile(r"^\s*(//|#)\s*Note \[" + re.escape(name) + r"\]")
    with open(path, encoding="utf-8") as text:
        return any(pattern.match(line) for line in text)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    args = parser.parse_args()
    index = os.path.join(args.root, "docs", "ARCHITECTURE.md")
    problems = []
    entries = 0
    with open(index, encoding="utf-8") as text:
        for number, line in enumerate(text, start=1):
            found = ENTRY.match(line)
            if not found:
                continue
            entries += 1
            name, path = found.group(1), found.group(2)
            full = os.path.join(args.root, path)
            if not os.path.isfile(full):
                problems.append(f"docs/ARCHITECTURE.md:{number}: Note [{name}] names {path}, which does not exist")
            elif not holds_note(full, name):
                problems.append(f"docs/ARCHITECTURE.md:{number}: Note [{name}] is not in {path}")
    if entries == 0:
        print("check_notes_index: docs/ARCHITECTURE.md has no index entries of the form - Note [Name] (`file`)")
        return 1
    return finish(problems, f"check_notes_index: ok, {entries} Notes are where the index says")


if __name__ == "__main__":
    sys.exit(main())
