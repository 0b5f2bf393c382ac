#!/usr/bin/env python3
"""List every member function declared in lockstep/ and defined nowhere.

A method declared in a class but never defined links as long as nothing
calls it, so the compiler never says it is dead (issue 61: Runner::build_hooks
was such a declaration, left behind when its body moved). This lint finds them
by reading the source as text (scripts/cpp_scan.py):

  - in every class, struct or union of lockstep/**/*.h and *.cpp (nested
    ones and `struct Outer::Inner {` too),
    a declaration `... name(...) qualifiers;` is a member function declared
    there; `= 0`, `= default`, `= delete`, friends, `using`, typedefs and
    macros (an upper-case name) are not;
  - it counts as defined when a body follows it in the class, or when some
    file of lockstep/ (headers and sources) holds `Class::name(`, with the
    class's template arguments if any (`Class<T>::name(`): a definition, or
    `Class::Class(...) = default;`.

A member declared in a header and defined out of the tree (a user's
override) does not exist in lockstep: the declaration is the contract then,
and it is pure virtual. Overloads share a name here: one overload defined
counts for all.

Usage (from anywhere; the repository root is found from this file):
    scripts/check_undefined_members.py            exits 1 when a member is
                                                  declared and defined nowhere,
                                                  listing each as
                                                  path:line: Class::name is ...
    scripts/check_undefined_members.py --root DIR checks another checkout
"""
import argparse
import os
import re
import sys

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
from cpp_scan import blank, finish, matching_open, sources

CLASS_HEAD = re.compile(r"^(?:template\s*<.*>\s*)?(?:class|struct|union)\b\s*(?:\[\[[^\]]*\]\]\s*)?"
                        r"(?:alignas\s*\([^)]*\)\s*)?"
                        r"((?:\w+\s*::\s*)*\w+)", re.S)
ACCESS = re.compile(r"^\s*(?:public|private|protected)\s*:(?!:)")
# After a declaration's parameter list: the qualifiers a member function may have.
QUALIFIERS = re.compile(r"^\s*(?:(?:const|volatile|noexcept(?:\s*\([^()]*\))?|override|final|&&|&|throw\s*\(\s*\))\s*)*"
                        r"(?:->\s*[\w:<>,\s*&]+)?\s*(=\s*(?:0|default|delete))?\s*$")
NAME_BEFORE = re.compile(r"(~?\w+|operator\s*(?:\(\s*\)|[^\w\s(]+|\w[\w\s:<>*&]*?))\s*$")
NOT_A_NAME = {"if", "for", "while", "switch", "return", "sizeof", "decltype", "alignas", "alignof", "static_assert",
              "void", "int", "bool", "char", "float", "double", "long", "short", "unsigned", "signed", "auto"}


def class_bodies(code):
    """(class name, body start, body end) of every class, struct or union in `code`, nested ones included."""
    found = []
    depth_heads = []  # what opened each enclosing brace: a class name or None
    statement_start = 0
    k = 0
    while k < len(code):
        c = code[k]
        if c in ";}":
            statement_start = k + 1
        elif c == "{":
            head = code[statement_start:k].strip()
            head = ACCESS.sub("", head).strip()
            match = CLASS_HEAD.match(head)
            if match and "(" not in head.split(match.group(1), 1)[0] and not re.search(r"\)\s*$", head):
                close = matching_close(code, k)
                found.append((re.split(r"\s*::\s*", match.group(1))[-1], k + 1, close))
            statement_start = k + 1
        k += 1
    return found


def matching_close(code, open_at):
    depth = 0
    for k in range(open_at, len(code)):
        if code[k] == "{":
            depth += 1
        elif code[k] == "}":
            depth -= 1
            if depth == 0:
                return k
    raise ValueError("a `{` that never closes")


def declarations(code, start, end):
    """(name, offset) of the member functions declared, without a body, directly in code[start:end]."""
    found = []
    statement = []  # pieces of the statement being read, braces' insides left out
    statement_at = start
    k = start
    while k < end:
        c = code[k]
        if c == "{":
            close = matching_close(code, k)
            text = "".join(statement)
            body = re.search(r"\)\s*(?:const|noexcept|override|final|&|\s)*(?:->[^;]*)?$", text)
            if body or re.search(r"\b(class|struct|union|enum|namespace)\b", text):
                # A body (the member is defined here) or a nested type: the statement ends with it.
                statement, statement_at = [], close + 1
            else:
                statement.append("{}")  # an initializer
            k = close + 1
            continue
        if c == ";":
            text = ACCESS.sub("", "".join(statement))
            name = declared_function(text)
            if name:
                found.append((name, statement_at))
            statement, statement_at = [], k + 1
        elif c == ":" and ACCESS.match("".join(statement) + ":") and not code.startswith("::", k):
            statement, statement_at = [], k + 1
            k += 1
            continue
        else:
            statement.append(c)
        k += 1
    return found


def declared_function(text):
    """The member function `text` (one statement of a class, without its `;`) declares, or None."""
    text = text.strip()
    while True:  # access specifiers before it
        stripped = ACCESS.sub("", text).strip()
        if stripped == text:
            break
        text = stripped
    if (not text or re.match(r"(friend|using|typedef|static_assert)\b", text)
            or re.search(r"\b(class|struct|enum)\b\s*\w*\s*$", text)):
        return None
    close = text.rfind(")")
    if close < 0:
        return None
    qualifiers = QUALIFIERS.match(text[close + 1:])
    if not qualifiers or qualifiers.group(1):
        return None  # not a function declaration, or = 0 / default / delete
    opened = matching_open(text, close, "(", ")")
    if opened <= 0:
        return None
    name = NAME_BEFORE.search(text[:opened])
    if not name or "=" in text[:name.start()]:
        return None  # no name, or a data member's initializer: `T value = make();`
    name = re.sub(r"\s+", " ", name.group(1)).strip()
    bare = name.lstrip("~")
    if bare in NOT_A_NAME or (bare.isupper() and "_" in bare) or text[:opened].rstrip().endswith(("]", ">")):
        return None
    return name


TEMPLATE_ARGUMENTS = r"<(?:[^<>;{}()]|<[^<>;{}()]*>)*>"  # one level of nesting: Class<std::vector<T>>
QUALIFIED_CALL = re.compile(r"\b(\w+)\s*(?:" + TEMPLATE_ARGUMENTS + r")?\s*::\s*"
                            r"(operator\s*(?:\(\s*\)|[^\w\s(]+)|~?\w+)\s*\(")


def qualified_names(code):
    """Every `Class::name` (`Class<...>::name`) followed by `(` in `code`, as (Class, name) pairs."""
    return {(found.group(1), re.sub(r"\s+", "", found.group(2))) for found in QUALIFIED_CALL.finditer(code)}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    args = parser.parse_args()
    blanked = {}
    for path in sources(args.root):
        with open(path, encoding="utf-8") as text:
            blanked[path] = blank(text.read())
    definitions = set()
    for code in blanked.values():
        definitions |= qualified_names(code)
    problems = []
    checked = 0
    for path, code in blanked.items():
        relative = os.path.relpath(path, args.root)
        for class_name, start, end in class_bodies(code):
            for name, at in declarations(code, start, end):
                checked += 1
                if (class_name, re.sub(r"\s+", "", name)) not in definitions:
                    line = code.count("\n", 0, at + len(code[at:]) - len(code[at:].lstrip())) + 1
                    problems.append(f"{relative}:{line}: {class_name}::{name} is declared but defined nowhere in "
                                    f"lockstep/: define it, or delete the declaration")
    return finish(problems, f"check_undefined_members: ok, {checked} member functions declared in lockstep/, "
                            "each defined")


if __name__ == "__main__":
    sys.exit(main())
