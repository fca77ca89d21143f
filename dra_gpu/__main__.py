from dra_gpu.cli import main

raise SystemExit(main())
