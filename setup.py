"""Packaging for tb-numerics.

Runtime needs only tensorboard, protobuf, numpy and crc32c: the reader, the
analysis, the CLI and the plugin import neither torch nor tensorflow. The
PyTorch capture (``tb_numerics_plugin.torch``) needs torch, which the user
already has; its CPU health kernel is a small C extension built here with the
machine's compiler and no torch headers.
"""

import setuptools

# The CPU health kernel of the PyTorch capture. -O3 lets gcc vectorize its
# ternary loops (-fno-trapping-math lets it if-convert float compares, which
# keeps NaN semantics); never -ffast-math, which assumes away the NaN/Inf it counts.
_HEALTH_EXTENSION = setuptools.Extension(
    "tb_numerics_plugin.torch._health",
    sources=["tb_numerics_plugin/torch/_health.c"],
    extra_compile_args=["-O3", "-fno-fast-math", "-fno-trapping-math", "-Wno-psabi"],
    optional=True,
)

setuptools.setup(
    name="tb-numerics",
    version="0.1.0",
    description="Numerics debugger for deep-learning training: a TensorBoard plugin",
    python_requires=">=3.9",
    packages=setuptools.find_packages(include=["tb_numerics_plugin", "tb_numerics_plugin.*"])
    + ["tb_numerics_plugin.frontend"],
    package_dir={"tb_numerics_plugin.frontend": "frontend"},
    ext_modules=[_HEALTH_EXTENSION],
    package_data={"tb_numerics_plugin.frontend": ["*.js", "*.css", "*.html", "*/*.js"]},
    install_requires=[
        "tensorboard>=2.12",
        "protobuf>=7.35.1,<8",
        "numpy>=1.22",
        "crc32c>=2.3",
    ],
    extras_require={
        "torch": ["torch>=2.4"],
        "dev": [
            "torch==2.13.0",
            "transformers==5.24.0",
            "tensorflow-cpu==2.21.0",
            "grpcio-tools==1.85.1",
            "pytest",
            "hypothesis==6.170.17",
            "psutil",
            "playwright==1.65.2",
        ],
    },
    entry_points={
        "console_scripts": ["tb-numerics = tb_numerics_plugin.cli:main"],
        "tensorboard_plugins": ["numerics = tb_numerics_plugin.plugin:NumericsPlugin"],
    },
)
