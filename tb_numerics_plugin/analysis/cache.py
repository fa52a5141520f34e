"""The analysis's own per-run cache, dropped when the run indexes new data.

Keyed weakly by the RunReader and checked against its ``generation``, so
results live exactly as long as the data they were computed from.
"""

import weakref

_CACHES = weakref.WeakKeyDictionary()  # run -> (generation, {key: value})


def for_run(run):
    """The cache dict of ``run`` for its current generation (call under ``run.lock``)."""
    entry = _CACHES.get(run)
    if entry is None or entry[0] != run.generation:
        entry = (run.generation, {})
        _CACHES[run] = entry
    return entry[1]
