"""import torch, on a path that holds this folder, gives the stand-in of
../standin_torch.py (for running scripts through python -m vramscope_watch
in tests): the module it puts in sys.modules is what the import returns."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
import standin_torch  # noqa: E402

standin_torch.install(float(os.environ.get("STANDIN_US_PER_ENTRY", "0.1")))
