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
RAW_STRING = re.compile(r'(?:u8|u|U|L)?R"([^()\\ ]{0,16})\(')
TAIL = 300  # characters at the end of a text that an anchored search reads


def blank(text):
    """The source with comments, literals and preprocessor lines as spaces (newlines kept)."""
    out = []
    i, n = 0, len(text)
    at_line_start = True
    while i < n:
        c = text[i]
        if c == "\n":
            out.append(c)
            i += 1
            at_line_start = True
            continue
        if at_line_start and c == "#":
            # A preprocessor line, with its continuations.
            while i < n and text[i] != "\n":
                if text[i] == "\\" and i + 1 < n and text[i + 1] == "\n":
                    out.append(" \n")
                    i += 2
                    continue
                out.append(" ")
                i += 1
            continue
        if not c.isspace():
            at_line_start = False
        if text.startswith("//", i):
            while i < n and text[i] != "\n":
                out.append(" ")
                i += 1
            continue
        if text.startswith("/*", i):
            end = text.find("*/", i + 2)
            end = n if end < 0 else end + 2
            out.append(re.sub(r"[^\n]", " ", text[i:end]))
            i = end
            continue
        raw = RAW_STRING.match(text, i) if c in "RuUL" else None
        if raw and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            end = text.find(")" + raw.group(1) + '"', raw.end())
            end = n if end < 0 else end + len(raw.group(1)) + 2
            out.append('"' + re.sub(r"[^\n]", " ", text[i + 1:end - 1]) + '"')
            i = end
            continue
        if c == '"' or (c == "'" and not (i > 0 and text[i - 1].isalnum() and i + 1 < n and text[i + 1].isalnum())):
            # A literal (a ' between two digits or letters is a digit separator).
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            out.append(c + " " * (min(j, n) - i - 1) + (c if j < n else ""))
            i = j + 1
            continue
        out.append(c)
        i += 1
    return "".join(out)


def matching_open(code, close_at, open_char, close_char):
    """The index of the bracket that `code[close_at]` closes, or -1."""
    depth = 0
    for k in range(close_at, -1, -1):
        if code[k] == close_char:
            depth += 1
        elif code[k] == open_char:
            depth -= 1
            if depth == 0:
                return k
    return -1


def search_end(pattern, text):
    """`pattern` (anchored with $) searched in the end of `text` only: fast on long texts."""
    offset = max(0, len(text) - TAIL)
    found = pattern.search(text, offset)
    return found


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


def sources(root):
    for folder, _, files in os.walk(os.path.join(root, "lockstep")):
        for name in sorted(files):
            if name.endswith((".cpp", ".h")):
                yield os.path.join(folder, name)


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
        problems.append(f"{relative}:{first}: {name} is {lines} lines (more than {args.limit}): split it along its phases")
    for problem in problems:
        print(problem)
    if problems:
        return 1
    print(f"check_function_length: ok, {len(every)} functions in lockstep/, none longer than {args.limit} lines")
    return 0


if __name__ == "__main__":
    sys.exit(main())
