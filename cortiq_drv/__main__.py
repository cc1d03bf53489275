import sys

from cortiq_drv.cli import main

sys.exit(main())
