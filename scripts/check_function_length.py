#!/usr/bin/env python3
"""List every function in lockstep/ whose body is longer than 80 lines.

A function that does several things in a row is split along the phases its
own comments name (issue 61); this lint keeps it so. A function's length is
the lines from the one holding its opening brace to the one holding its
closing brace, both counted. Functions are found by a brace-matching scan of
lockstep/**/*.cpp and *.h, not by a compiler:

  - comments, string and character literals (raw strings too) and
    preprocessor lines are blanked first, keeping the line numbers;
  - a `{` outside any function body opens a function body when the text
    before it ends with a parameter list `)` (after const, noexcept,
    override, final, mutable, `&`, `&&` or a trailing return type), with a
    constructor's member-initializer list, or with a lambda's `]`; the `(`
    must not belong to a control statement;
  - any other `{` there (namespace, class, enum, initializer) is entered and
    the scan goes on inside it, so member functions and lambdas in
    namespace-scope initializers (a registration's factory) are found too;
  - a lambda inside a function counts as part of that function.

Unit tests (`*_test.cpp`) and the fuzz targets are measured too. A file
whose braces do not balance after blanking is an error (the scan would be
wrong there), so the lint cannot silently skip a file.

Usage (from anywhere; the repository root is found from this file):
    scripts/check_function_length.py            exits 1 when a function is longer
                                                than the limit, listing each as
                                                path:line: name is N lines
    scripts/check_function_length.py --limit N  another limit
    scripts/check_function_length.py --list K   also prints the K longest
    scripts/check_function_length.py --root DIR checks another checkout
"""
import argparse
import os
import re
import sys

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
from cpp_scan import blank, finish, matching_open, search_end, sources

LIMIT = 80
HEAD_WINDOW = 4000  # characters before a brace that the classification reads
CONTROL = {"if", "for", "while", "switch", "catch", "return", "sizeof", "decltype", "alignof", "alignas"}
TRAILING_QUALIFIER = re.compile(r"(\bconst|\bnoexcept|\boverride|\bfinal|\bmutable|\btry|&&|&)\s*$")
TRAILING_RETURN = re.compile(r"->\s*[\w:<>,\s*&]+$")
IDENTIFIER_BEFORE = re.compile(r"([~\w]+|operator\s*[^\w\s(]+|operator\s*\(\s*\))\s*$")
QUALIFIED_NAME = re.compile(r"((?:[\w~]+(?:<[^<>()]*>)?::)*(?:[~\w]+|operator\s*[^\w\s(]+|operator\s*\(\s*\)))\s*$")
EXCEPTION_SPEC = re.compile(r"\b(noexcept|throw)\s*$")
MEMBER_NAME = re.compile(r"[\w:<>]+$")
TEMPLATE_LAMBDA = re.compile(r"\]\s*<[^<>]*>$")


def strip_qualifiers(head):
    while True:
        head = head.rstrip()
        found = search_end(TRAILING_QUALIFIER, head)
        stripped = head[:found.start()] if found else head
        if stripped == head and head.endswith(")"):
            # noexcept(...) / throw(...)
            opened = matching_open(head, len(head) - 1, "(", ")")
            found = search_end(EXCEPTION_SPEC, head[:opened]) if opened > 0 else None
            if found:
                stripped = head[:found.start()]
        if stripped == head:
            found = search_end(TRAILING_RETURN, head)
            stripped = head[:found.start()] if found else head
        if stripped == head:
            return head
        head = stripped


def skip_member_initializers(head):
    """`Foo(...) : a_(x), b_{y}` -> `Foo(...)`; anything else unchanged."""
    original = head
    while head.endswith(")") or head.endswith("}"):
        opened = matching_open(head, len(head) - 1, "(" if head.endswith(")") else "{", head[-1])
        if opened <= 0:
            return original
        before = head[:opened].rstrip()
        name = search_end(MEMBER_NAME, before)
        if not name:
            return original
        before = before[:name.start()].rstrip()
        if before.endswith(","):
            head = before[:-1].rstrip()
            continue
        if before.endswith(":") and not before.endswith("::"):
            return strip_qualifiers(before[:-1])
        return original
    return original


def function_name(code, brace):
    """The name of the function whose body opens at `brace`, or None if it is no function body."""
    # What decides is the end of the text before the brace: a window of it
    # keeps the regular expressions' anchored searches short.
    head = strip_qualifiers(code[max(0, brace - HEAD_WINDOW):brace])
    if head.endswith("]"):
        return "<lambda>"
    if not head.endswith(")"):
        head = skip_member_initializers(head)
        if not head.endswith(")"):
            return None
    else:
        # `Foo(...) : a_(x) {` ends with `)` too: find the parameter list.
        unwound = skip_member_initializers(head)
        if unwound != head and unwound.endswith(")"):
            head = unwound
    opened = matching_open(head, len(head) - 1, "(", ")")
    if opened < 0:
        return None
    before = head[:opened].rstrip()
    if before.endswith("]"):
        return "<lambda>"
    if before.endswith(">") and search_end(TEMPLATE_LAMBDA, before):
        return "<lambda>"
    name = search_end(IDENTIFIER_BEFORE, before)
    if not name or name.group(1) in CONTROL:
        return None
    qualified = search_end(QUALIFIED_NAME, before)
    return qualified.group(1).replace(" ", "") if qualified else name.group(1)


def functions(path):
    """(name, first line, line count) of every outermost function body in `path`."""
    with open(path, encoding="utf-8") as text:
        code = blank(text.read())
    found = []
    depth = 0
    function_depth = None  # the depth of the function body being read
    function_start = None
    for k, c in enumerate(code):
        if c == "{":
            if function_depth is None:
                name = function_name(code, k)
                if name is not None:
                    function_depth = depth
                    function_start = (name, k)
            depth += 1
        elif c == "}":
            depth -= 1
            if depth < 0:
                raise ValueError(f"{path}:{code.count(chr(10), 0, k) + 1}: a `}}` closes nothing")
            if function_depth is not None and depth == function_depth:
                name, start = function_start
                first = code.count("\n", 0, start) + 1
                last = first + code.count("\n", start, k)
                found.append((name, first, last - first + 1))
                function_depth = None
    if depth != 0:
        raise ValueError(f"{path}: {depth} `{{` never closed (after blanking comments, literals and #lines)")
    return found


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    parser.add_argument("--limit", type=int, default=LIMIT)
    parser.add_argument("--list", type=int, default=0, metavar="K")
    args = parser.parse_args()
    every = []
    problems = []
    for path in sorted(sources(args.root)):
        relative = os.path.relpath(path, args.root)
        try:
            every += [(lines, relative, first, name) for name, first, lines in functions(path)]
        except ValueError as error:
            problems.append(str(error).replace(path, relative))
    every.sort(key=lambda item: (-item[0], item[1], item[2]))
    for lines, relative, first, name in every[:args.list]:
        print(f"{relative}:{first}: {name} {lines} lines")
    long = [item for item in every if item[0] > args.limit]
    for lines, relative, first, name in long:
        problems.append(f"{relative}:{first}: {name} is {lines} lines (more than {args.limit}): "
                        "split it along its phases")
    return finish(problems, f"check_function_length: ok, {len(every)} functions in lockstep/, "
                            f"none longer than {args.limit} lines")


if __name__ == "__main__":
    sys.exit(main())
