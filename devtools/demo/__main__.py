"""``python -m devtools.demo``: see :mod:`devtools.demo`."""

import sys

from devtools.demo import main

sys.exit(main())
