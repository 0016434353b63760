"""The experiments' tests share tests/emulated's tiny scenario (the engine backend they run on)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "emulated"))
