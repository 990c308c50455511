"""Helpers every layer shares (configs, safe file writes, progress bars, process pools, the
per-rank TensorFlow runtime). Nothing here imports TensorFlow at module level, so the workflow
package and the Airflow image can use them too."""
