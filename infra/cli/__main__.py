"""`python -m infra.cli`: the same as the `tenant-windows` script."""

import sys

from infra.cli.main import main

if __name__ == "__main__":
    sys.exit(main())
