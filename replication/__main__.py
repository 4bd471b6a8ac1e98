"""``python -m replication``: the project's command line (:mod:`ops.cli`, the tools above the library)."""

import sys

from ops.cli import main

sys.exit(main())
