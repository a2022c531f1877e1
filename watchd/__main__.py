from watchd.cli import main

raise SystemExit(main())
