"""``python -m ortfuse.models list|build [NAME ...] [--force]``."""

import argparse
import sys

from .cli import add_arguments, run

parser = argparse.ArgumentParser(prog="python -m ortfuse.models", description="List or build the model zoo.")
add_arguments(parser)
sys.exit(run(parser.parse_args()))
