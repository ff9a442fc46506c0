import sys

from omnilive.cli import main

sys.exit(main())
