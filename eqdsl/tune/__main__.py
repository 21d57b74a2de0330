"""``python -m eqdsl.tune --worker ...``: one tuning job's worker process (``worker.main``).
Users run ``eqdsl tune SPEC``."""

import sys

from .worker import main

if sys.argv[1:2] == ["--worker"]:
    sys.exit(main(sys.argv[2:]))
sys.exit("usage: eqdsl tune SPEC (this module's own entry point is for its worker processes)")
