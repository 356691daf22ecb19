import sys

from nfsrdma.cli import main

sys.exit(main())
