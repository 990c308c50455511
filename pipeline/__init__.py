"""Data stages: Kaldi data directories, features, TFRecord shards and the tf.data input."""

import os

# TensorFlow's C++ start-up chatter (oneDNN, CPU features) buries the stages' own output in task
# logs; users can still set the variable themselves.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
