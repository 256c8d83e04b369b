"""Convert a trainer release (manifest.json + head_weights.npy) into a Hugging Face Hub model folder.

    python convert_npy.py --manifest manifest.json --weights head_weights.npy --output-dir router/

The same as `benchgen-router convert` (its --help lists every option). `--output-dir .` in a clone
of this repository replaces the committed router with the converted one.
"""

import sys

from benchgen_router.cli.main import main

if __name__ == "__main__":
    sys.exit(main(["convert", *sys.argv[1:]], prog="convert_npy.py"))
