"""Build steps pyproject.toml cannot declare: the C health kernel and the shipped .proto files.

Metadata, dependencies and packages are in pyproject.toml. Runtime needs only
tensorboard, protobuf, numpy and crc32c: the reader, the analysis, the CLI and
the plugin import neither torch nor tensorflow. The PyTorch capture
(``tb_numerics_plugin.torch``) needs torch, which the user already has; its CPU
health kernel is a small C extension built here with the machine's compiler and
no torch headers (optional: without a compiler the capture uses a slower path
and says so). The reader's framing has an optional C extension too (without it
the reader walks records in Python, slower).
"""

import glob
import os

import setuptools
from setuptools.command.build_ext import build_ext
from setuptools.command.build_py import build_py

# The CPU health kernel of the PyTorch capture. -O3 lets gcc vectorize its
# ternary loops (-fno-trapping-math lets it if-convert float compares, which
# keeps NaN semantics); never -ffast-math, which assumes away the NaN/Inf it counts.
# It also launches the CUDA health kernels, shipped as PTX, through the driver it
# opens at run time: no CUDA toolkit is needed to build or to run it.
_HEALTH_EXTENSION = setuptools.Extension(
    "tb_numerics_plugin.torch._health",
    sources=["tb_numerics_plugin/torch/_health.c", "tb_numerics_plugin/torch/_health_module.c",
             "tb_numerics_plugin/torch/_health_rows.c",
             "tb_numerics_plugin/torch/_health_cuda.c",
             "tb_numerics_plugin/torch/_health_device.c"],
    depends=["tb_numerics_plugin/torch/_health.h"],
    libraries=["dl"],  # the CUDA driver is opened at run time (_health_cuda.c)
    extra_compile_args=["-O3", "-fno-fast-math", "-fno-trapping-math", "-Wno-psabi",
                        "-fvisibility=hidden"],
    optional=True,
)
# The reader's TFRecord framing (walk and CRC checks): optional, the reader
# has the same walk in Python (reader/wire.py) and uses it without a compiler.
_FRAMES_EXTENSION = setuptools.Extension(
    "tb_numerics_plugin.reader._frames",
    sources=["tb_numerics_plugin/reader/_frames.c"],
    extra_compile_args=["-O2"],
    optional=True,
)
# The capture's per-op hot path (an op inside a module call or an optimizer
# step): optional, recorder.py records the same op in Python without it.
# Link-time optimization inlines the small helpers its files share (about 220
# fewer instructions per recorded op of 10,200, docs/benchmarks.md); a compiler
# or linker without it builds the extension again without it.
_RECORD_EXTENSION = setuptools.Extension(
    "tb_numerics_plugin.torch._record",
    sources=["tb_numerics_plugin/torch/_record.c", "tb_numerics_plugin/torch/_record_scope.c",
             "tb_numerics_plugin/torch/_record_op.c", "tb_numerics_plugin/torch/_record_input.c",
             "tb_numerics_plugin/torch/_record_entry.c",
             "tb_numerics_plugin/torch/_record_encode.c",
             "tb_numerics_plugin/torch/_record_exec.c",
             "tb_numerics_plugin/torch/_record_health.c",
             "tb_numerics_plugin/torch/_record_rows.c",
             "tb_numerics_plugin/torch/_record_bound.c",
             "tb_numerics_plugin/torch/_record_names.c",
             "tb_numerics_plugin/torch/_record_counts.c",
             "tb_numerics_plugin/torch/_record_segment.c",
             "tb_numerics_plugin/torch/_record_forward.c",
             "tb_numerics_plugin/torch/_record_state.c"],
    depends=["tb_numerics_plugin/torch/_record.h", "tb_numerics_plugin/torch/_record_wire.h",
             "tb_numerics_plugin/torch/_health.h", "tb_numerics_plugin/torch/_native_facts.h"],
    extra_compile_args=["-O2", "-fvisibility=hidden", "-flto"],
    extra_link_args=["-flto"],
    optional=True,
)
_PROTO_DIR = os.path.join("proto", "tb_numerics_plugin", "proto")


class _BuildExtLtoOptional(build_ext):
    """Builds an extension again without -flto where the toolchain has no link-time
    optimization (clang with a linker lacking its plugin, say)."""

    def build_extension(self, ext):
        try:
            super().build_extension(ext)
        except Exception as exc:  # distutils' CompileError, LinkError (no common import)
            if "-flto" not in ext.extra_compile_args:
                raise
            self.warn("building %s without -flto: %s" % (ext.name, exc))
            ext.extra_compile_args = [a for a in ext.extra_compile_args if a != "-flto"]
            ext.extra_link_args = [a for a in ext.extra_link_args if a != "-flto"]
            super().build_extension(ext)


class _BuildPyWithProtos(build_py):
    """Ships the .proto sources (kept under proto/, see `make proto`) beside their gencode."""

    def run(self):
        super().run()
        target = os.path.join(self.build_lib, "tb_numerics_plugin", "proto")
        self.mkpath(target)  # an editable build's build_lib starts empty
        for source in sorted(glob.glob(os.path.join(_PROTO_DIR, "*.proto"))):
            self.copy_file(source, os.path.join(target, os.path.basename(source)))


setuptools.setup(
    ext_modules=[_HEALTH_EXTENSION, _FRAMES_EXTENSION, _RECORD_EXTENSION],
    cmdclass={"build_py": _BuildPyWithProtos, "build_ext": _BuildExtLtoOptional},
)
