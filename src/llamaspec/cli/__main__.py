"""`python -m llamaspec.cli`."""

import sys

from llamaspec.cli.main import main

sys.exit(main())
