#!/usr/bin/env python3
"""The include layering of lib/fsdpp/, checked against the order docs/architecture.md writes down.

docs/architecture.md holds, between the markers `<!-- layers -->` and `<!-- /layers -->`, a table whose rows are
`| <layer number> | <folder>, <folder> | what they hold |` and, between `<!-- upward -->` and `<!-- /upward -->`,
the include arrows allowed to run against it, one `| lib/fsdpp/<from file> | lib/fsdpp/<to file> | why |` a row.
A file under lib/fsdpp/<folder>/ may include files of its own folder and of folders on a LOWER layer: an include
of a folder on the same or a higher layer fails (so no two folders can depend on each other), as does a folder
the table does not place. Exit 0 and a summary when the tree keeps the order; 1 and every offending include
(file:line, the include, both layers) otherwise.

  check_layers.py [REPO]        REPO: the checkout (default: two folders above this script)
"""
import os
import re
import sys

INCLUDE = re.compile(r'^\s*#\s*include\s*"fsdpp/([^/"]+)/([^"]+)"')


def section(text, name):
    m = re.search(r"<!-- %s -->(.*?)<!-- /%s -->" % (name, name), text, re.S)
    if not m:
        sys.exit(f"docs/architecture.md: no <!-- {name} --> ... <!-- /{name} --> section; it holds the layer table")
    return [[c.strip().strip("`") for c in line.strip().strip("|").split("|")]
            for line in m.group(1).splitlines() if line.strip().startswith("|") and not set(line) <= set("|- :")]


def main():
    repo = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
    doc = open(os.path.join(repo, "docs", "architecture.md"), encoding="utf-8").read()
    layer_of = {}
    for row in section(doc, "layers"):
        if not row[0].isdigit():
            continue  # the header
        for folder in row[1].split(","):
            layer_of[folder.strip().strip("`").rstrip("/")] = int(row[0])
    allowed = {(r[0], r[1]) for r in section(doc, "upward") if r[0].startswith("lib/")}
    lib = os.path.join(repo, "lib", "fsdpp")
    bad, arrows, used = [], 0, set()
    for folder in sorted(os.listdir(lib)):
        if not os.path.isdir(os.path.join(lib, folder)):
            continue
        if folder not in layer_of:
            bad.append(f"lib/fsdpp/{folder}/: a folder docs/architecture.md's layer table does not place; add it")
            continue
        for dirpath, _, files in os.walk(os.path.join(lib, folder)):
            for name in sorted(files):
                path = os.path.join(dirpath, name)
                rel = os.path.relpath(path, repo)
                with open(path, encoding="utf-8", errors="replace") as f:
                    for number, line in enumerate(f, 1):
                        m = INCLUDE.match(line)
                        if not m or m.group(1) == folder:
                            continue
                        arrows += 1
                        target = m.group(1)
                        to_file = f"lib/fsdpp/{target}/{m.group(2)}"
                        if target not in layer_of:
                            bad.append(f"{rel}:{number}: includes {to_file}, a folder the layer table does not place")
                        elif layer_of[target] >= layer_of[folder]:
                            if (rel, to_file) in allowed:
                                used.add((rel, to_file))
                                continue
                            bad.append(f"{rel}:{number}: includes {to_file}: {folder}/ is on layer {layer_of[folder]}, "
                                       f"{target}/ on layer {layer_of[target]} (a folder includes only lower layers; "
                                       f"move the piece both need below both, or name the arrow with a reason in "
                                       f"docs/architecture.md)")
    for stale in sorted(allowed - used):
        bad.append(f"docs/architecture.md names the upward arrow {stale[0]} -> {stale[1]}, which the code no longer has; "
                   f"remove the row")
    if bad:
        print("\n".join(bad))
        print(f"layering: {len(bad)} problem(s)")
        return 1
    print(f"layering: {arrows} includes between {len(layer_of)} folders keep the order of docs/architecture.md "
          f"({len(used)} named upward arrow(s))")
    return 0


if __name__ == "__main__":
    sys.exit(main())
