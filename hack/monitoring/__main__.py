import sys

from hack.monitoring.generate import main

sys.exit(main())
