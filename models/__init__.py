"""Models (acoustic, synthesis), distributed strategies, training and evaluation."""
