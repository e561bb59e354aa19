"""``python -m interlock_temporal.cli``: the ``interlock`` command."""

import sys

from ._app import main

sys.exit(main())
