#!/usr/bin/python3
"""Every relative link in README.md and docs/**/*.md resolves.

    tests/docs/links_test.py [--source DIR]

For each Markdown link or image, [text](target) or ![alt](target), outside
code blocks and code spans, whose target is not absolute (no scheme such as
https: or mailto:):
  - the path part, relative to the file that holds the link, names an
    existing file or directory inside the source tree DIR (default: the
    repository this script is in);
  - an #anchor, in the same page or in another .md file, matches a heading
    of that page under GitHub's rules: the heading's text (links reduced to
    their text, code and emphasis marks dropped) lower-cased, every
    character other than a letter, a digit, a space, '-' or '_' removed,
    spaces turned into '-', and a repeated heading numbered -1, -2, ...
Prints every broken link as FILE:LINE: target: why, and exits 1 when there
is one (0 otherwise). Standard library only.
"""

import argparse
import os
import re
import sys
import urllib.parse

# A fenced code block starts and ends with ``` or ~~~ (possibly indented).
FENCE = re.compile(r"^\s*(```|~~~)")
# Code spans: a run of backticks, then anything up to the same run.
CODE_SPAN = re.compile(r"(`+)(.+?)\1")
# [text](target "title") and ![alt](target); the target may be <...>.
# Text may hold one level of brackets ([`a[0]`](x) and badges).
LINK = re.compile(
    r"!?\[(?P<text>(?:[^\[\]]|\[[^\[\]]*\])*)\]"
    r"\(\s*(?P<target><[^>]*>|[^\s()]*(?:\([^\s()]*\)[^\s()]*)*)"
    r"(?:\s+(?:\"[^\"]*\"|'[^']*'|\([^)]*\)))?\s*\)")
HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


def strip_code(lines):
    """Yields (line number, text) of the lines outside fenced code blocks,
    with code spans blanked out (same length, so columns stay)."""
    fence = None
    for number, line in enumerate(lines, 1):
        match = FENCE.match(line)
        if match:
            if fence is None:
                fence = match.group(1)
                continue
            if match.group(1) == fence:
                fence = None
                continue
        if fence is not None:
            continue
        yield number, CODE_SPAN.sub(lambda m: " " * len(m.group(0)), line)


def slug(heading):
    """GitHub's anchor for a heading's text."""
    text = re.sub(r"!?\[((?:[^\[\]]|\[[^\[\]]*\])*)\]\([^)]*\)", r"\1",
                  heading)
    text = re.sub(r"<[^>]+>", "", text)
    text = text.strip().lower()
    kept = []
    for char in text:
        if char.isalnum() or char in "-_ ":
            kept.append(char)
    return "".join(kept).replace(" ", "-")


def anchors(path, cache):
    """The anchors of the headings of the Markdown file at `path`."""
    if path in cache:
        return cache[path]
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    found = set()
    seen = {}
    fence = None
    for line in lines:
        match = FENCE.match(line)
        if match:
            if fence is None:
                fence = match.group(1)
            elif match.group(1) == fence:
                fence = None
            continue
        if fence is not None:
            continue
        heading = HEADING.match(line)
        if not heading:
            continue
        base = slug(heading.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    cache[path] = found
    return found


def markdown_files(source):
    files = []
    readme = os.path.join(source, "README.md")
    if os.path.isfile(readme):
        files.append(readme)
    docs = os.path.join(source, "docs")
    for root, dirs, names in os.walk(docs):
        dirs.sort()
        for name in sorted(names):
            if name.endswith(".md"):
                files.append(os.path.join(root, name))
    return files


def check_file(path, source, cache):
    """The number of relative links in one file, and the broken ones as
    (line, target, why)."""
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    checked = 0
    broken = []
    root = os.path.realpath(source)
    for number, line in strip_code(lines):
        for match in LINK.finditer(line):
            target = match.group("target")
            if target.startswith("<") and target.endswith(">"):
                target = target[1:-1]
            if not target:
                broken.append((number, "()", "empty link target"))
                continue
            if SCHEME.match(target) or target.startswith("//"):
                continue
            checked += 1
            link_path, _, anchor = target.partition("#")
            link_path = urllib.parse.unquote(link_path)
            anchor = urllib.parse.unquote(anchor)
            if link_path:
                if link_path.startswith("/"):
                    resolved = os.path.join(root, link_path.lstrip("/"))
                else:
                    resolved = os.path.join(os.path.dirname(path), link_path)
                resolved = os.path.realpath(resolved)
                if resolved != root and not resolved.startswith(root + os.sep):
                    broken.append((number, target,
                                   "points outside the source tree"))
                    continue
                if not os.path.exists(resolved):
                    broken.append((number, target, "no such file or directory"))
                    continue
            else:
                resolved = os.path.realpath(path)
            if not anchor:
                continue
            if not resolved.endswith(".md") or os.path.isdir(resolved):
                continue
            if anchor not in anchors(resolved, cache):
                broken.append((number, target,
                               f"no heading with anchor #{anchor} in "
                               f"{os.path.relpath(resolved, root)}"))
    return checked, broken


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--source",
        default=os.path.dirname(os.path.dirname(os.path.dirname(
            os.path.abspath(__file__)))),
        help="the source tree (default: this script's repository)")
    args = parser.parse_args()
    source = os.path.realpath(args.source)
    files = markdown_files(source)
    if not files:
        print(f"links_test: no README.md or docs/*.md under {source}")
        return 1
    cache = {}
    links = 0
    broken = []
    for path in files:
        checked, found = check_file(path, source, cache)
        links += checked
        for number, target, why in found:
            broken.append(f"{os.path.relpath(path, source)}:{number}: "
                          f"{target}: {why}")
    for line in broken:
        print(line)
    print(f"links_test: {links} relative links in {len(files)} files, "
          f"{len(broken)} broken link{'s' if len(broken) != 1 else ''}")
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
