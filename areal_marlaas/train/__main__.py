"""``python -m areal_marlaas.train --config X.yaml [--tasks T.yaml] [k=v ...]``."""

import sys

from areal_marlaas.errors import ConfigError
from areal_marlaas.train.trainer import main

if __name__ == "__main__":
    try:
        sys.exit(main())
    except ConfigError as e:
        print(f"marlaas train: error: {e}", file=sys.stderr)
        sys.exit(2)
