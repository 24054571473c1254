"""What every script imports first: this checkout's mxmirror and symbols before any installed
copy (a script measures the code beside it), and MXNet's subgraph chatter off."""

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
os.environ.setdefault("MXNET_SUBGRAPH_VERBOSE", "0")
