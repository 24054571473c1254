"""python -m mxmirror"""

from .cli import main

raise SystemExit(main())
