"""`python -m legato CONFIG`: the local launcher's entry point (legato.runtime.launch.main); it must never hold logic of its own."""

import sys

from legato.runtime.launch import main

sys.exit(main())
