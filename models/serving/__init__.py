"""Serving a trained model: the MLflow pyfunc model (pyfunc.py), the operator's limits on requests
(policy.py) and one way to name and open a trained model (opening.py); each model's server is in its
own package (models/asr/server.py, models/tts/server.py).

Registered models name their pyfunc class `models.serving.pyfunc.SpeechModel` (MLflow pickles the class by
its import path), so it is importable here.
"""

from models.serving.pyfunc import SpeechModel  # noqa: F401
