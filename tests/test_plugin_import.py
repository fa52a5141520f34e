"""The plugin entry point imports without torch or tensorflow (TensorBoard imports it unguarded)."""

import subprocess
import sys

_PROBE = (
    "import sys\n"
    "import tb_numerics_plugin.plugin\n"
    "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'tensorflow'))\n"
    "print(','.join(heavy))\n"
)


def test_importing_the_plugin_never_imports_torch_or_tensorflow():
    out = subprocess.run(
        [sys.executable, "-c", _PROBE], check=True, capture_output=True, text=True, timeout=120
    )
    assert out.stdout.strip() == ""


def test_entry_point_names_the_numerics_plugin_class():
    from importlib import metadata

    points = [p for p in metadata.entry_points(group="tensorboard_plugins") if p.name == "numerics"]
    assert [p.value for p in points] == ["tb_numerics_plugin.plugin:NumericsPlugin"]
    from tb_numerics_plugin.plugin import NumericsPlugin

    assert points[0].load() is NumericsPlugin
