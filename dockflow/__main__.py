import sys

from dockflow.cli import main

sys.exit(main())
