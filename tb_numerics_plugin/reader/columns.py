"""Growable numpy columns: the compact storage behind the digests.

A million trace digests must fit in a few hundred MB, so the reader never
keeps one Python object per record: each field is one numpy array that grows
by doubling, and strings are interned into small integer ids. A column may
be declared :class:`Narrow`: stored in a smaller dtype while every value fits
it exactly (health vectors of counts in float32, ids in int32), widened once
when one does not.
"""

import numpy as np


class Narrow:
    """A column dtype: ``narrow`` while every value appended fits it exactly, else ``wide``.

    Floats fit when they convert to ``narrow`` and back unchanged (NaN stays NaN),
    integers when they lie in its range. Readers see values equal to what was
    appended either way; only the column's dtype tells which storage it has.
    """

    def __init__(self, narrow, wide):
        self.narrow = np.dtype(narrow)
        self.wide = np.dtype(wide)

    def fits(self, values):
        """Whether every value of the array ``values`` is exact in the narrow dtype."""
        if not values.size:
            return True
        if self.narrow.kind == "f":
            with np.errstate(over="ignore", invalid="ignore"):
                back = values.astype(self.narrow).astype(values.dtype)
            same = back == values
            if values.dtype.kind == "f":
                same |= np.isnan(values)
            return bool(same.all())
        info = np.iinfo(self.narrow)
        return bool(values.min() >= info.min and values.max() <= info.max)


# Health vectors (counts are exact in float32 up to 2**24) and ids / positions.
FLOAT32_IF_EXACT = Narrow(np.float32, np.float64)
INT32_IF_FITS = Narrow(np.int32, np.int64)


class Columns:
    """A table of equal-length numpy columns that grows by whole batches.

    Args:
      spec: dict ``name -> (dtype or Narrow, width)``; width 0 means a 1-D column,
        width k > 0 a 2-D column of k values per row (rows padded with NaN
        for float columns when a batch is narrower). A 2-D column widens when
        a batch brings more values per row.
    """

    def __init__(self, spec):
        self._spec = dict(spec)
        self._size = 0
        self._capacity = 0
        self._data = {}
        self._narrow = {}  # name -> Narrow, while the column is still narrow
        for name, (dtype, width) in self._spec.items():
            shape = (0, width) if width else (0,)
            if isinstance(dtype, Narrow):
                self._narrow[name] = dtype
                dtype = dtype.narrow
            self._data[name] = np.empty(shape, dtype)

    def __len__(self):
        return self._size

    def __getitem__(self, name):
        """Returns the live view of column ``name`` (length ``len(self)``)."""
        return self._data[name][: self._size]

    def reserve(self, rows):
        """Makes room for ``rows`` rows in all, so that a known final size is
        allocated once instead of in growth steps (each one copies every column)."""
        if rows > self._capacity:
            self._grow(rows, exact=True)

    def _grow(self, need, exact=False):
        # 1.5x growth: the copy while growing peaks at 2.5x the data, not 3x.
        capacity = need if exact else max(need, self._capacity + self._capacity // 2, 1024)
        for name, arr in self._data.items():
            new = np.empty((capacity,) + arr.shape[1:], arr.dtype)
            if arr.dtype.kind == "f":
                new[self._size :] = np.nan
            new[: self._size] = arr[: self._size]
            self._data[name] = new
        self._capacity = capacity

    def _promote(self, name, values):
        """Widens the dtype of narrow column ``name`` when ``values`` do not fit it."""
        kind = self._narrow[name]
        values = np.asarray(values)
        if values.dtype.kind not in "fiub":
            values = values.astype(kind.wide)
        if kind.fits(values):
            return
        del self._narrow[name]
        self._data[name] = self._data[name].astype(kind.wide)

    def _widen(self, name, width):
        arr = self._data[name]
        new = np.full((arr.shape[0], width), np.nan, arr.dtype)
        new[:, : arr.shape[1]] = arr
        self._data[name] = new

    def extend(self, **batch):
        """Appends one batch of rows; every column must be given, same length.

        Raises:
          ValueError: a column is missing or lengths differ.
        """
        if set(batch) != set(self._data):
            raise ValueError("batch columns %s != %s" % (sorted(batch), sorted(self._data)))
        n = {len(v) for v in batch.values()}
        if len(n) != 1:
            raise ValueError("batch columns differ in length: %s" % sorted(n))
        n = n.pop()
        if not n:
            return
        if self._size + n > self._capacity:
            self._grow(self._size + n)
        stop = self._size + n
        for name, values in batch.items():
            if name in self._narrow:
                self._promote(name, values)
            arr = self._data[name]
            if arr.ndim == 2:
                values = np.asarray(values)
                if values.ndim == 2 and values.shape[1] > arr.shape[1]:
                    self._widen(name, values.shape[1])
                    arr = self._data[name]
                if values.ndim == 2:
                    arr[self._size : stop, : values.shape[1]] = values
                    arr[self._size : stop, values.shape[1] :] = np.nan
                else:
                    arr[self._size : stop] = np.nan
            else:
                arr[self._size : stop] = values
        self._size = stop


class Interner:
    """Maps strings (or any hashable) to dense int ids and back."""

    def __init__(self):
        self._ids = {}
        self.values = []

    def id(self, value):
        """Returns the id of ``value``, assigning the next one if new."""
        got = self._ids.get(value)
        if got is None:
            got = self._ids[value] = len(self.values)
            self.values.append(value)
        return got

    def find(self, value):
        """Returns the id of ``value`` or -1 if it was never interned."""
        return self._ids.get(value, -1)

    def __len__(self):
        return len(self.values)
