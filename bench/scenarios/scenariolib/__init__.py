"""What the end-to-end scenarios of bench/scenarios share.

ROOT is the repository this copy of the scenarios belongs to (the
meridian binary, tools/build and deploy/configs are found under it).
"""

import os

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.dirname(os.path.abspath(__file__)))))
