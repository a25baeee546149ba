"""``python -m areal_marlaas.train --config X.yaml [--tasks T.yaml] [k=v ...]``."""

import sys

from areal_marlaas.train.heap import keep_freed_pages_if_asked

keep_freed_pages_if_asked(sys.argv[1:])  # before torch and AReaL start threads

from areal_marlaas.errors import ConfigError  # noqa: E402
from areal_marlaas.train import screen  # noqa: E402

if not screen.asks_verbose(sys.argv[1:]):  # before AReaL's import-time INFO lines
    screen.quiet_console()

from areal_marlaas.train.trainer import main  # noqa: E402

if __name__ == "__main__":
    try:
        sys.exit(main())
    except ConfigError as e:
        print(f"marlaas train: error: {e}", file=sys.stderr)
        sys.exit(2)
