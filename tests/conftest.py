import os
import sys

# tests/helpers.py is importable as `helpers` from every suite.
sys.path.insert(0, os.path.dirname(__file__))
