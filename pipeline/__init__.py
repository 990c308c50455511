"""Data stages: Kaldi data directories, features, TFRecord shards and the tf.data input."""
