"""A reader worker: indexes one file set in its own process (``RunReader.update``).

``python -m tb_numerics_plugin.reader.worker`` reads a pickled
:class:`~tb_numerics_plugin.reader.fileset.FileSet` from stdin, runs its ``update()``
and writes the pickled ``(file set, grew)`` to stdout; or ``None`` when the index came
to hold open file handles (a ring buffer's generation), which cannot travel: the caller
reads that file set itself. Only ``reader/parallel.py`` starts it, with data of its own.
"""

import pickle
import sys


def main():
    fs = pickle.load(sys.stdin.buffer)
    grew = fs.update()
    result = (fs, grew)
    if fs.holds_files():
        fs.close()
        result = None
    pickle.dump(result, sys.stdout.buffer, protocol=pickle.HIGHEST_PROTOCOL)
    sys.stdout.buffer.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
