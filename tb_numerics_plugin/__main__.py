"""``python -m tb_numerics_plugin report LOGDIR``: the `tb-numerics` command."""

import sys

from tb_numerics_plugin.cli import main

if __name__ == "__main__":
    sys.exit(main())
