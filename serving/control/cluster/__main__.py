"""`python -m serving.control.cluster start|stop|status|run`: the local Ray head's command line
(serving.control.cluster.cli)."""

from __future__ import annotations

import sys

from serving.control.cluster.cli import main

if __name__ == "__main__":
    sys.exit(main())
