"""Health rows of CUDA tensors with our CUDA kernels: one launch per tensor, from C.

The kernels (``_health_cuda.cu``) ship as PTX and are launched through the CUDA
driver by the ``_health`` extension (``_health_cuda.c``), which opens the driver
at run time: no CUDA toolkit at install, no nvcc or Triton at run time. Each
launch merges a tensor's statistics into a row that holds the empty row's
values, on the tensor's device and current stream, with no host sync. Where they
cannot run (no C extension, no CUDA device, a driver older than the PTX's CUDA
13) :func:`ready` is False, a warning says why once, and ``kernels.HealthBatch``
falls back to Triton, then to torch.

:class:`CudaRows` is a batch's block of rows on its first CUDA device: the C
recorder queues rows into it directly (``_record_health.c``, through its
``_health.DeviceRows``), without a Python call per tensor.
"""

import logging
import os

import torch

from tb_numerics_plugin.torch import health

try:  # built by setup.py; optional so a machine without a compiler still works
    from tb_numerics_plugin.torch import _health as _c_health
except ImportError:  # pragma: no cover - depends on the build
    _c_health = None

_log = logging.getLogger("tb_numerics_plugin.torch")
PTX = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_health_cuda.ptx")
# torch's device index -> raw handle of its current CUDA stream; None in a CPU build
_RAW_STREAM = getattr(torch._C, "_cuda_getCurrentRawStream", None)


class _Cuda:
    kernels = None
    failure = None  # why they cannot be used, once tried
    templates = {}  # device -> its empty row
    ready = set()  # device ordinals the kernels were compiled for


def cuda_kernels():
    """The CUDA health kernels (a ``_health.CudaKernels``), loaded on first use; None
    without a CUDA device, the C extension or a driver that takes their PTX
    (:func:`failure` says which; logged once)."""
    if _Cuda.kernels is None and _Cuda.failure is None:
        if _c_health is None:
            _Cuda.failure = "the C extension tb_numerics_plugin.torch._health was not built"
        elif not torch.cuda.is_available():
            _Cuda.failure = "no CUDA device"
        else:
            try:
                with open(PTX, "rb") as f:
                    _Cuda.kernels = _c_health.CudaKernels(f.read())
            except (OSError, RuntimeError) as exc:
                _give_up(exc)
    return _Cuda.kernels


def ready(device):
    """True when the kernels run on CUDA ``device`` (a torch.device): the driver compiled
    them for it, once. Where it cannot (a driver older than the PTX) they are given up
    for the process, with a warning naming the driver's error: Triton or torch then."""
    kernels = cuda_kernels()
    if kernels is None:
        return False
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _Cuda.ready:
        try:
            kernels.prepare(index)
        except RuntimeError as exc:
            _give_up(exc)
            return False
        _Cuda.ready.add(index)
    return True


def _give_up(exc):
    _Cuda.kernels, _Cuda.failure = None, "%s: %s" % (type(exc).__name__, exc)
    _log.warning("tb-numerics: CUDA health kernels unavailable (%s); Triton or torch "
                 "computes CUDA health instead", _Cuda.failure)


def failure():
    """Why :func:`cuda_kernels` is None (None before the first try or when they load)."""
    return _Cuda.failure


def empty_rows(device, count):
    """``count`` empty rows on ``device`` (float64 ``[count, 12]``), what the kernels
    merge into; the template row crosses to the device once per device."""
    template = _Cuda.templates.get(device)
    if template is None:
        template = torch.tensor(health.EMPTY_ROW, dtype=torch.float64).to(device)
        _Cuda.templates[device] = template
    return template.repeat(count, 1)


def raw_stream_source():
    """torch's ``device index -> raw handle of its current CUDA stream``, or None where
    this torch has none (a CPU build)."""
    return _RAW_STREAM


def raw_stream(index):
    """The raw handle of CUDA device ``index``'s current stream."""
    if _RAW_STREAM is not None:
        return _RAW_STREAM(index)
    return torch.cuda.current_stream(index).cuda_stream


def raw_stats_into(tensor, level, row):
    """Queues the raw row of a CUDA tensor into ``row`` (a float64 ``[12]`` device tensor
    holding the empty row, see :func:`empty_rows`); no sync.

    Raises:
      RuntimeError: the kernels cannot be used there (:func:`ready` is False) or the
        driver failed.
    """
    if not ready(row.device):
        raise RuntimeError("CUDA health kernels unavailable: %s" % _Cuda.failure)
    kernels = _Cuda.kernels
    t = health.dense_view(tensor.detach())
    index = row.device.index
    kernels.launch(t.data_ptr(), t.numel(), health.C_CODES[t.dtype], level, row.data_ptr(),
                   raw_stream(index), index)


class CudaRows:
    """Rows on one CUDA device, reused from fetch to fetch (a batch's, as ``HostRows``
    are for the CPU): ``c`` is the ``_health.DeviceRows`` the C recorder queues into
    while the batch has registered it (``c.block`` >= 0).

    Args:
      capacity: rows.
      device: the torch.device (CUDA) of the tensors they take.
    """

    def __init__(self, capacity, device):
        self.device = device
        self.rows = empty_rows(device, capacity)
        self._index = self.rows.device.index
        self.c = _c_health.DeviceRows(cuda_kernels(), capacity)
        self.c.restart(-1, self.rows.data_ptr(), self._index)  # Python may add rows now

    @property
    def used(self):
        """Rows queued."""
        return self.c.used

    def add(self, tensor, level):
        """Queues the row of a tensor on :attr:`device`; returns its index."""
        t = health.dense_view(tensor)
        return self.c.add(t.data_ptr(), t.numel(), health.C_CODES[t.dtype], level,
                          raw_stream(self._index))

    def host(self):
        """Copies the queued rows to the host: the one device sync per buffer."""
        return self.rows[: self.c.used].cpu().numpy()

    def restart(self, block):
        """Empties the rows (after :meth:`host`) and registers them as ``block`` (or -1).

        The used rows get the empty row again on the current stream, which is then
        waited for: a kernel queued on another stream must not overtake it."""
        used = self.c.used
        if used:
            self.rows[:used].copy_(_Cuda.templates[self.device].expand(used, health.RAW_WIDTH))
            torch.cuda.current_stream(self.device).synchronize()
        self.c.restart(block, self.rows.data_ptr(), self._index)
