"""``python -m chive_lab`` is the same as the ``chive-lab`` command."""

from .cli import main

raise SystemExit(main())
