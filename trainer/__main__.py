import sys

from trainer.launch import main

sys.exit(main())
