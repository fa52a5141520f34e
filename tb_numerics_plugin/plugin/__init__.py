"""The ``numerics`` TensorBoard plugin (entry point ``tb_numerics_plugin.plugin:NumericsPlugin``).

Importing it loads TensorBoard's plugin base, numpy and our reader, never
torch or tensorflow: TensorBoard imports plugin entry points unguarded, so a
heavy or failing import here would break TensorBoard itself.
"""

from tb_numerics_plugin.plugin.plugin import NumericsPlugin

__all__ = ["NumericsPlugin"]
