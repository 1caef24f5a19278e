"""``python -m shipyard.server.compose docker|docker-compose ARGS``: what the stand-ins in
``$SHIPYARD_HOME/server/client/bin`` run."""

import sys

from shipyard.server.compose.command import main

sys.exit(main())
