"""python -m mxmirror"""

from mxmirror.frontends.cli import main

raise SystemExit(main())
