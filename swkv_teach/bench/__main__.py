"""``python -m swkv_teach.bench``: see :mod:`swkv_teach.bench`."""

import sys

from swkv_teach.bench import main

sys.exit(main())
