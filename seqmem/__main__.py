"""`python -m seqmem`: the command line."""

import sys

from seqmem.cli import main

sys.exit(main())
