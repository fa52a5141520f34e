"""Writes one benchmark's section of docs/benchmarks.md, leaving the others alone."""

import os
import re


def write_section(path, title, body):
    """Replaces the ``## <title>`` section of ``path`` with ``body`` (appends it when absent).

    A section runs from its heading to the next ``## `` heading or the end of the file.
    """
    old = open(path).read() if os.path.exists(path) else "# Benchmarks\n"
    section = "## %s\n\n%s\n" % (title, body.strip())
    pattern = re.compile(r"^## %s\n.*?(?=^## |\Z)" % re.escape(title), re.S | re.M)
    if pattern.search(old):
        new = pattern.sub(lambda _: section + "\n", old, count=1)
    else:
        new = old.rstrip("\n") + "\n\n" + section
    with open(path, "w") as f:
        f.write(new)
