"""`python -m comfyui_ideogram4_int8 ...`"""

import sys

from .cli import main

sys.exit(main())
