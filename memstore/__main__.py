"""``python -m memstore``: the memstore command."""

from memstore.cli import main

raise SystemExit(main())
