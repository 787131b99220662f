import sys

from wim.cli import main

sys.exit(main())
