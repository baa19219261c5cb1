"""`python -m veil.cli`, as the `veil` command."""

import sys

from veil.cli import main

sys.exit(main())
