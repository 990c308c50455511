"""Models (acoustic, synthesis), distributed strategies, training and evaluation."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # see pipeline/__init__.py
