"""``python -m rlmesh``: the ``rlmesh`` command (see ``rlmesh.cli``)."""

import sys

from .cli import main

sys.exit(main())
