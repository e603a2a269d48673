import sys

from bench.compare.runner import main

sys.exit(main())
