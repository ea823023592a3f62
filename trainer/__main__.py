import sys

from legato.launch import main

sys.exit(main())
