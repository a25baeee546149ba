"""``python -m areal_marlaas.cli``: the ``marlaas`` command."""

import sys

from areal_marlaas.cli import main

sys.exit(main())
