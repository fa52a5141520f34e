"""Names of tfdbg2 dump files: one definition for the writer and the reader.

A file set is the six files one writer process (a host or rank) writes:
``tfdbg_events.<unix_seconds>.<host>[.<part>].<suffix>``, TensorFlow's naming
with an optional part (``rank3``) so ranks sharing a dump root never clash.
"""

import os
import re
import socket
import time

PREFIX = "tfdbg_events"
SUFFIXES = (
    "metadata",
    "source_files",
    "stack_frames",
    "graphs",
    "execution",
    "graph_execution_traces",
)
# The writer's own sidecar beside the six files (not part of tfdbg2: TensorFlow's
# reader ignores it): what the writer kept, dropped and lost, in fixed-size JSON
# rewritten in place (docs/format.md, "Writer status").
STATUS_SUFFIX = "writer_status.json"
# Groups: unix seconds, host label (host plus any part), suffix.
FILE_RE = re.compile(r"^%s\.(\d+)\.(.+)\.(%s)$" % (PREFIX, "|".join(SUFFIXES)))


def file_set_prefix(dump_root, host_name=None, part=None, unix_seconds=None):
    """Returns the path prefix of a file set (everything before ``.<suffix>``)."""
    host_name = host_name or socket.gethostname()
    stamp = int(time.time() if unix_seconds is None else unix_seconds)
    name = "%s.%d.%s" % (PREFIX, stamp, host_name)
    if part:
        name += "." + part
    return os.path.join(dump_root, name)
