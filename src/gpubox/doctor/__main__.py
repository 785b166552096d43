"""python -m gpubox.doctor INVENTORY [--json]"""

import sys

from gpubox.doctor.cli import main

sys.exit(main(sys.argv[1:]))
