"""``python -m opendws.agent [--agent-url URL]``: run the agent on this VM."""

from opendws.agent.run import main

raise SystemExit(main())
