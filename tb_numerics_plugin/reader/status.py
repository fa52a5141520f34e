"""The writer-status sidecar of a file set: what the writer kept, dropped and lost.

Our writer keeps ``<prefix>.writer_status.json`` beside the six tfdbg2 files
(docs/format.md, "Writer status"): 4096 bytes of JSON padded with spaces,
rewritten in place at each flush, at close and at the first write error.
TensorFlow's dumps have none. A missing, empty or all-blank sidecar means "no
status" (a writer that just started, or another writer); one that does not
parse means "no status" plus one warning. Nothing here raises.
"""

import json
import os
import socket

from tb_numerics_plugin.filenames import STATUS_SUFFIX

# Largest sidecar read: the contract's 4096 bytes, with room to spare.
_MAX_BYTES = 1 << 16
_COUNTED = ("execution", "graph_execution_traces", "graphs", "stack_frames", "source_files")
_RING = ("execution", "graph_execution_traces")
_WORDS = {"execution": ("execution", "executions"),
          "graph_execution_traces": ("graph execution trace", "graph execution traces")}
# A writer whose sidecar has not been rewritten for this long, and that is not
# a live process of this machine, is taken as gone (it flushes every few seconds).
STALE_S = 60.0


def path_of(prefix):
    return "%s.%s" % (prefix, STATUS_SUFFIX)


def _count(value):
    """A non-negative int from a JSON value, else 0 (a hostile sidecar sizes nothing)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return 0
    if value != value or value in (float("inf"), float("-inf")) or value < 0:
        return 0
    return int(min(value, 1 << 62))


def _counts(obj, keys=None):
    if not isinstance(obj, dict):
        return {}
    out = {}
    for k, v in obj.items():
        if isinstance(k, str) and (keys is None or k in keys):
            out[k] = _count(v)
    return out


def _clean(raw):
    """The sidecar's JSON object reduced to the contract's fields and types."""
    state = raw.get("state")
    ring = raw.get("circular_buffer_size")
    updated = raw.get("updated_wall_time")
    first_error = raw.get("first_error")
    return {
        "version": _count(raw.get("version")),
        "pid": _count(raw.get("pid")),
        "tfdbg_run_id": raw.get("tfdbg_run_id") if isinstance(raw.get("tfdbg_run_id"), str)
        else "",
        "circular_buffer_size": int(ring) if isinstance(ring, int) and not isinstance(ring, bool)
        and -1 <= ring < (1 << 62) else -1,
        "state": state if state in ("open", "closed") else "open",
        "updated_wall_time": float(updated) if isinstance(updated, (int, float))
        and not isinstance(updated, bool) and abs(updated) < 1e12 else 0.0,
        "written": _counts(raw.get("written"), _COUNTED),
        "evicted": _counts(raw.get("evicted"), _RING),
        "lost": _counts(raw.get("lost")),
        "first_error": first_error if isinstance(first_error, str) else None,
    }


def read(prefix):
    """Reads the sidecar of the file set at ``prefix``.

    Returns:
      ``(status dict or None, warning str or None)``; the dict holds the
      contract's fields (wrong types neutralised) without ``notes``.
    """
    path = path_of(prefix)
    try:
        with open(path, "rb") as f:
            data = f.read(_MAX_BYTES)
    except FileNotFoundError:
        return None, None
    except OSError as e:
        return None, "%s: cannot read the writer status: %s" % (path, e)
    text = data.decode("utf-8", "replace").strip(" \n\r\t\x00")
    if not text:
        return None, None  # created, not yet written
    try:
        raw = json.loads(text)
    except ValueError as e:
        return None, "%s: writer status is not JSON (%s); ignored" % (path, e)
    if not isinstance(raw, dict):
        return None, "%s: writer status is not a JSON object; ignored" % path
    return _clean(raw), None


def _alive_here(pid, label):
    """Whether ``pid`` is a live process and the file set was written on this machine."""
    host = socket.gethostname()
    if not pid or not (label == host or label.startswith(host + ".")):
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, OSError):
        return True
    return True


def writer_gone(status, label, now):
    """Whether the writer of an ``open`` sidecar is gone without closing (killed?)."""
    if status["state"] == "closed":
        return False
    if _alive_here(status["pid"], label):
        return False
    return now - status["updated_wall_time"] >= STALE_S


def notes(status, label, now):
    """Human sentences about a parsed status.

    Returns:
      ``(notes, losses)``: every note, and those that mean records were lost.
    """
    out, losses = [], []
    ring = status["circular_buffer_size"]
    if ring > 0:
        for suffix in _RING:
            written = status["written"].get(suffix, 0)
            evicted = status["evicted"].get(suffix, 0)
            if evicted:
                out.append("ring buffer of %d kept the last %d of %d %s; earlier history "
                           "dropped" % (ring, max(written - evicted, 0), written,
                                        _WORDS[suffix][1]))
    if writer_gone(status, label, now):
        if ring > 0:
            text = ("writer did not close: ring-buffered executions and traces since its last "
                    "flush are lost (killed?)")
        else:
            text = ("writer did not close: records written since its last flush may be lost "
                    "(killed?)")
        out.append(text)
        losses.append(text)
    lost = sum(status["lost"].values())
    if lost:
        kinds = ", ".join("%s %d" % kv for kv in sorted(status["lost"].items()) if kv[1])
        text = "%d record%s lost (%s): %s" % (lost, "" if lost == 1 else "s", kinds,
                                             status["first_error"] or "no error message")
        out.append(text)
        losses.append(text)
    elif status["first_error"]:
        text = "writer error: %s" % status["first_error"]
        out.append(text)
        losses.append(text)
    return out, losses


def expected_records(status, suffix):
    """Records a closed writer left in the file ``suffix``, or None when unknown."""
    if status is None or status["state"] != "closed" or suffix not in status["written"]:
        return None
    written = status["written"][suffix]
    if status["circular_buffer_size"] > 0 and suffix in _RING:
        return max(written - status["evicted"].get(suffix, 0), 0)
    return written
