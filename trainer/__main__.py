"""`python -m legato CONFIG`: the local launcher's entry point (legato.runtime.launch.main); it must never hold logic of its own."""

from legato.runtime.launch import main
from legato.system.exiting import finish

finish(main)
