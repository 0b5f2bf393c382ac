"""Reading C++ source as text for the lints (scripts/check_function_length.py,
scripts/check_undefined_members.py, scripts/check_unused_includes.py): literals and comments blanked, brackets
matched, anchored searches kept short. Not a parser: it reads lockstep's own
code, and a lint that cannot follow a file (braces that do not balance) says
so instead of passing it over. Its finish() (a lint's printout and exit status)
serves the lints that read no C++ too (scripts/check_architecture_map.py,
scripts/check_notes_index.py).
"""
import os
import re

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


def sources(root, endings=(".cpp", ".h")):
    """Every file of lockstep/ with one of `endings`, sorted."""
    found = []
    for folder, _, files in os.walk(os.path.join(root, "lockstep")):
        found += [os.path.join(folder, name) for name in files if name.endswith(endings)]
    return sorted(found)


def finish(problems, ok_line):
    """A lint's exit status: each problem printed and 1, or `ok_line` printed and 0."""
    print("\n".join(problems) if problems else ok_line)
    return 1 if problems else 0
