"""`python -m kvbound.cli ARGS`, as the `kvbound` console script."""
import sys

from . import main

sys.exit(main())
