from ortfuse.cli import main

raise SystemExit(main())
