import sys

from oxillama.cli.main import main

sys.exit(main())
