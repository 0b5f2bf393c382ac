#!/usr/bin/env python3
"""List every `#include "lockstep/..."` in lockstep/ and apps/ that nothing in
the including file uses, and every forward declaration (`class X;`) there
that nothing else in its file names.

An include left behind when the code that needed it moved still compiles, so
no compiler says it is dead (issue 61: trainer.h included by a writer for one
constant, optim_wrapper.h by collectives.h for two typedefs). This lint reads
the source as text (scripts/cpp_scan.py):

  - what a header offers: the names it declares or defines at namespace
    scope (classes, structs, unions, enums and their enumerators, functions,
    variables and constants, aliases, templates, torch module holders made
    by TORCH_MODULE) and its macros; a header
    that declares nothing of its own (one that gathers others) offers what
    the headers it includes offer;
  - an include is used when the including file, outside its #include lines,
    mentions a name the header offers;
  - or when the file reaches one of the header's classes through another
    lockstep header it includes, at any depth (hook.h's `Trainer&
    trainer()`), and calls a member of a name the header declares
    (`trainer().iter()`): calling a member needs the class's definition,
    without naming the class;
  - a file's own header (foo.cpp's foo.h) always counts as used, and so does
    an include marked with IWYU's pragmas, `// IWYU pragma: keep` or
    `// IWYU pragma: export`, followed by the reason (a header that
    re-exports another as part of its interface; members of a base class
    outside lockstep, such as torch::nn::Module's, that no name shows).

Checked to fail on what issue 61 found: optim_wrapper.h put back in
collectives.h or metrics_recorder.h, trainer.h in console_writer.cpp, and
`class Batch;` put back in optim_wrapper.h.

Usage (from anywhere; the repository root is found from this file):
    scripts/check_unused_includes.py            exits 1 when an include is
                                                unused, listing each as
                                                path:line: lockstep/x/y.h is
                                                included and nothing of it used
    scripts/check_unused_includes.py --root DIR checks another checkout
"""
import argparse
import os
import re
import sys

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
from cpp_scan import blank, finish

# A forward declaration at the start of a line (a friend declaration is not).
FORWARD = re.compile(r"^[ \t]*(?:class|struct)\s+([A-Za-z_]\w*)\s*;", re.M)
INCLUDE = re.compile(r'^\s*#\s*include\s+"(lockstep/[^"]+)"', re.M)
DEFINE = re.compile(r"^\s*#\s*define\s+([A-Za-z_]\w*)", re.M)
IDENTIFIER = re.compile(r"[A-Za-z_]\w*")
MEMBER_ACCESS = re.compile(r"(?:\.|->)\s*([A-Za-z_]\w*)\s*\(")
CLASS_WITH_BODY = re.compile(r"\b(?:class|struct)\s+(?:\[\[[^\]]*\]\]\s*)?([A-Za-z_]\w*)[^;{()]*\{")
# IWYU's pragmas: an include kept on purpose (a header that re-exports
# another as part of its interface, or one needed for what no name shows).
KEEP = re.compile(r"//\s*IWYU pragma:\s*(?:keep|export)\b")
TYPE_HEAD = re.compile(r"\b(?:class|struct|union|enum(?:\s+class|\s+struct)?|namespace)\s+"
                       r"(?:\[\[[^\]]*\]\]\s*)?(?:alignas\s*\([^)]*\)\s*)?([A-Za-z_]\w*)")
ALIAS = re.compile(r"\busing\s+([A-Za-z_]\w*)\s*=")
TYPEDEF = re.compile(r"\btypedef\b[^;]*?\b([A-Za-z_]\w*)\s*(?:\[[^\]]*\]\s*)?;")
# A name followed by a parameter list, an initializer or the end of a
# declaration: functions, members, variables, constants, enumerators.
DECLARED = re.compile(r"\b([A-Za-z_]\w*)\s*(?:\(|\{|=|;|,|\[|:(?!:))")
ENUM_BODY = re.compile(r"\benum\b[^{;]*\{([^}]*)\}")
NAMESPACE_OPEN = re.compile(r"(?:\bnamespace\b[\w:\s]*|\bextern\s*\"\s*\"\s*)$")
# Words a declaration's pattern would catch that name nothing of a header's.
NOT_NAMES = {
    "if", "for", "while", "switch", "return", "sizeof", "alignof", "decltype", "static_assert",
    "noexcept", "operator", "public", "private", "protected", "default", "case", "template",
    "const", "override", "final", "explicit", "inline", "static", "virtual", "constexpr",
    "typename", "namespace", "lockstep", "internal", "std", "torch", "c10", "at", "nlohmann",
    "delete", "new", "this", "throw", "catch", "try", "do", "else", "auto", "void", "int", "bool",
    "char", "double", "float", "long", "short", "unsigned", "signed", "size_t", "int64_t",
    "int32_t", "uint64_t", "uint32_t", "uint8_t", "int8_t", "extern", "mutable", "volatile",
    "struct", "class", "enum", "union", "using", "typedef", "friend", "true", "false", "nullptr",
}


def repo_root():
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def namespace_scope(code):
    """`code` with everything inside a class, function or initializer braces
    blanked: what is left is declared at namespace scope (or in extern "C")."""
    out = list(code)
    stack = []  # per open brace: whether it opens a namespace (or extern "C")
    for i, c in enumerate(code):
        if c == "{":
            before = code[max(0, i - 200):i]
            stack.append(bool(NAMESPACE_OPEN.search(before)))
        elif c == "}":
            if stack:
                stack.pop()
        elif not all(stack) and c != "\n":
            out[i] = " "
    return "".join(out)


def without_arguments(code):
    """`code` without what parentheses and angle brackets hold (parameters,
    template arguments): the names there are not the header's own."""
    previous = None
    while previous != code:
        previous = code
        code = re.sub(r"\([^()]*\)", lambda m: "(" + re.sub(r"[^\n]", " ", m.group(0)[1:-1]) + ")", code)
        code = re.sub(r"<[^<>;{}]*>", lambda m: re.sub(r"[^\n]", " ", m.group(0)), code)
    return code


def member_names(text):
    """The names a header declares inside its classes (members, nested types)."""
    code = blank(text)
    inner = "".join(" " if a == b and a != "\n" else a for a, b in zip(code, namespace_scope(code)))
    return {name for name in DECLARED.findall(inner) + TYPE_HEAD.findall(inner) if name not in NOT_NAMES}


def declared_names(text):
    """The names a header declares at namespace scope: what a file that uses
    the header must name (a member is reached through its class's name or
    through something else the file names)."""
    names = set(DEFINE.findall(text))
    code = blank(text)
    # A torch module holder, TORCH_MODULE(Linear), declares the class `Linear`.
    module_holders = re.findall(r"\bTORCH_MODULE\s*\(\s*([A-Za-z_]\w*)\s*\)", code)
    for body in ENUM_BODY.findall(code):
        names |= {item.split("=")[0].strip() for item in body.split(",") if item.strip()}
    outer = without_arguments(namespace_scope(code))
    names |= set(TYPE_HEAD.findall(outer)) | set(ALIAS.findall(outer)) | set(TYPEDEF.findall(outer))
    names |= set(DECLARED.findall(outer))
    names |= set(module_holders)
    return {name for name in names if name and name not in NOT_NAMES}


def files_to_check(root):
    found = []
    for top in ("lockstep", "apps"):
        for folder, _, files in os.walk(os.path.join(root, top)):
            found += [os.path.join(folder, name) for name in files if name.endswith((".cpp", ".h"))]
    return sorted(found)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--root", default=repo_root())
    args = parser.parse_args()
    root = args.root

    texts = {}
    for path in files_to_check(root):
        with open(path, encoding="utf-8") as f:
            texts[os.path.relpath(path, root)] = f.read()
    own = {path: declared_names(text) for path, text in texts.items() if path.endswith(".h")}
    members = {path: member_names(text) for path, text in texts.items() if path.endswith(".h")}
    mentions = {path: set(IDENTIFIER.findall(blank(text))) for path, text in texts.items() if path.endswith(".h")}
    classes = {path: set(CLASS_WITH_BODY.findall(namespace_scope(blank(text))))
               for path, text in texts.items() if path.endswith(".h")}

    offered_cache = {}

    def offered(header, seen=()):
        if header in offered_cache:
            return offered_cache[header]
        names = set(own.get(header, ()))
        if not names and header not in seen:  # a header that gathers others
            for included in INCLUDE.findall(texts.get(header, "")):
                names |= offered(included, seen + (header,))
        offered_cache[header] = names
        return names

    def reached_through_others(header, path, text):
        """Whether `path` reaches one of `header`'s classes through another
        header it includes (hook.h's `Trainer& trainer()`), and calls a
        member of that name: that needs the definition, without naming the
        class."""
        others = [other for other in INCLUDE.findall(text) + [os.path.splitext(path)[0] + ".h"]
                  if other not in (header, path)]
        return any(classes.get(header, set()) & mentioned_below(other, header) for other in others)

    def mentioned_below(start, header):
        """The names `start` and the lockstep headers it includes, at any
        depth, mention; `header`'s own text left out."""
        names, seen, todo = set(), {header}, [start]
        while todo:
            current = todo.pop()
            if current in seen:
                continue
            seen.add(current)
            names |= mentions.get(current, set())
            todo += INCLUDE.findall(texts.get(current, ""))
        return names

    problems = []
    checked = 0
    for path, text in texts.items():
        code = blank(text)
        used = set(IDENTIFIER.findall(code))
        called = set(MEMBER_ACCESS.findall(code))
        own_header = os.path.splitext(path)[0] + ".h"
        for number, line in enumerate(text.split("\n"), 1):
            found = INCLUDE.match(line)
            if not found:
                continue
            header = found.group(1)
            if header == own_header or header not in texts:
                continue  # a file's own header; a generated or installed one
            checked += 1
            if KEEP.search(line) or offered(header) & used:
                continue
            if called & members.get(header, set()) and reached_through_others(header, path, text):
                continue
            problems.append(f"{path}:{number}: {header} is included and nothing of it used")
        for found in FORWARD.finditer(code):
            if len(re.findall(r"\b" + found.group(1) + r"\b", code)) == 1:
                number = code.count("\n", 0, found.start()) + 1
                problems.append(f"{path}:{number}: {found.group(1)} is declared and nothing else names it")
    return finish(problems, f"check_unused_includes: ok, {checked} includes of lockstep headers each used")


if __name__ == "__main__":
    sys.exit(main())
