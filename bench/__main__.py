"""``python -m bench``: run every benchmark."""

from bench.scale_down import main

raise SystemExit(main())
