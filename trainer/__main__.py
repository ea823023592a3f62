import sys

from legato.runtime.launch import main

sys.exit(main())
