from compat.cli import main

raise SystemExit(main())
