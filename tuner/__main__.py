"""`python -m tuner` is the same as the `specdecode-tune` console script."""

from tuner.cli import main

raise SystemExit(main())
